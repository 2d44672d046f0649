// Loading governord's protocol from the repository's own governor.proto.
//
// The package never carries a hand-written copy of the protocol. A published
// package ships proto/governor.proto, which `npm pack` copies from
// api/governorpb/governor.proto (scripts/copy-proto.js, run by prepack); in a
// checkout of the repository the file is read where it lives.

import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import path from 'node:path';
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import protobuf from 'protobufjs';

const here = path.dirname(fileURLToPath(import.meta.url));

/** Where governor.proto is looked for, in order. */
export const protoCandidates = [
  path.join(here, '..', 'proto', 'governor.proto'), // the published package
  path.join(here, '..', '..', '..', 'api', 'governorpb', 'governor.proto'), // a checkout of the repository
];

// The shape of every message this package hands to callers: the proto's
// field names in camelCase, 64-bit integers as decimal strings (a double
// cannot hold every id), enums by name, and unset fields at their defaults.
const conversion = { keepCase: false, longs: String, enums: String, defaults: true, oneofs: true };

let loaded;

/**
 * findProto returns the path of governor.proto, or throws naming every place
 * it looked.
 */
export function findProto() {
  const found = protoCandidates.find((p) => existsSync(p));
  if (!found) {
    throw new Error(`@governor/client: governor.proto not found; looked in ${protoCandidates.join(', ')}`);
  }
  return found;
}

/**
 * protocol loads governor.proto once and returns the gRPC client constructor,
 * the protobufjs root (to decode error details) and, for each method, its
 * path, whether it streams or takes a request id, and how to encode its
 * request and decode its response (as the client constructor does).
 */
export function protocol() {
  if (loaded) return loaded;
  const file = findProto();
  const definition = protoLoader.loadSync(file, conversion);
  const Governor = grpc.loadPackageDefinition(definition).governor.v1.Governor;
  const root = protobuf.loadSync(file);
  root.resolveAll();
  const service = root.lookupService('governor.v1.Governor');
  const methods = new Map();
  for (const [name, m] of Object.entries(service.methods)) {
    const req = m.resolvedRequestType;
    const res = m.resolvedResponseType;
    methods.set(name, {
      path: `/governor.v1.Governor/${name}`,
      stream: Boolean(m.responseStream || m.requestStream),
      takesRequestId: Boolean(req.fields.requestId),
      encode: (object) => req.encode(req.fromObject(object)).finish(),
      decode: (bytes) => res.toObject(res.decode(bytes), conversion),
    });
  }
  loaded = { file, Governor, root, methods };
  return loaded;
}

/** toObject converts a decoded detail the way responses are converted. */
export function toObject(type, message) {
  return type.toObject(message, conversion);
}

// google.rpc.Status, the envelope of grpc-status-details-bin. It is gRPC's
// own, not governord's protocol, and protobufjs does not bundle it.
const rpcStatus = protobuf.Root.fromJSON({
  nested: {
    google: {
      nested: {
        protobuf: { nested: { Any: { fields: { type_url: { type: 'string', id: 1 }, value: { type: 'bytes', id: 2 } } } } },
        rpc: {
          nested: {
            Status: {
              fields: {
                code: { type: 'int32', id: 1 },
                message: { type: 'string', id: 2 },
                details: { rule: 'repeated', type: 'google.protobuf.Any', id: 3 },
              },
            },
          },
        },
      },
    },
  },
}).lookupType('google.rpc.Status');

/**
 * statusDetails decodes the details of a failed call's status into
 * { typeName: object } for the types governor.proto defines; others are
 * skipped.
 */
export function statusDetails(metadata) {
  const raw = metadata?.get?.('grpc-status-details-bin')?.[0];
  if (!raw) return {};
  const { root } = protocol();
  const out = {};
  let st;
  try {
    st = rpcStatus.decode(raw);
  } catch {
    return out; // a malformed envelope: the code and message still stand
  }
  for (const any of st.details) {
    const typeName = any.type_url.slice(any.type_url.lastIndexOf('/') + 1);
    // lookup, not lookupTypeOrEnum, which throws for a type governor.proto
    // does not define (google.rpc.RetryInfo beside a RateLimited).
    const type = root.lookup(typeName);
    if (!type || !(type instanceof protobuf.Type)) continue;
    try {
      out[type.name] = toObject(type, type.decode(any.value));
    } catch {
      // an undecodable detail is left out rather than hiding the error
    }
  }
  return out;
}
