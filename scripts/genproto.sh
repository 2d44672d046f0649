#!/usr/bin/env bash
# genproto.sh regenerates the Go code for Governor's gRPC API from
# api/governorpb/governor.proto. The generated files are committed, so only
# run this after editing the .proto file.
#
# It installs what it needs and is safe to run again:
#   - protoc (with the well-known .proto files): from apt on Debian/Ubuntu if
#     missing; elsewhere install it yourself (e.g. `brew install protobuf`).
#   - protoc-gen-go and protoc-gen-go-grpc, pinned below, with `go install`
#     into a cache folder; nothing on PATH is used or changed.
#
# Usage:
#   scripts/genproto.sh           regenerate the files in place
#   scripts/genproto.sh --check   fail if the committed files are out of date
set -euo pipefail

PROTOC_GEN_GO_VERSION=v1.36.12
PROTOC_GEN_GO_GRPC_VERSION=v1.5.1

cd "$(dirname "$0")/.."

check=false
case "${1:-}" in
"") ;;
--check) check=true ;;
*)
	echo "usage: $0 [--check]" >&2
	exit 2
	;;
esac

# wkt_ok reports whether protoc can find the well-known types we import.
wkt_ok() {
	command -v protoc >/dev/null 2>&1 || return 1
	local tmp
	tmp=$(mktemp -d)
	printf 'syntax = "proto3";\nimport "google/protobuf/duration.proto";\nimport "google/protobuf/timestamp.proto";\n' >"$tmp/t.proto"
	protoc -I "$tmp" --descriptor_set_out=/dev/null "$tmp/t.proto" >/dev/null 2>&1
	local rc=$?
	rm -rf "$tmp"
	return $rc
}

if ! wkt_ok; then
	if command -v apt-get >/dev/null 2>&1; then
		sudo=""
		if [ "$(id -u)" -ne 0 ]; then
			sudo="sudo"
		fi
		echo "genproto: installing protoc with apt-get" >&2
		$sudo apt-get update -qq
		$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq protobuf-compiler libprotobuf-dev >/dev/null
	fi
	if ! wkt_ok; then
		echo "genproto: protoc (with google/protobuf/*.proto) is not installed; install it and run again" >&2
		exit 1
	fi
fi

# The plugins go into a per-user cache folder, one subfolder per version, so
# a pinned version is never mixed up with whatever is on PATH.
cache="${XDG_CACHE_HOME:-$HOME/.cache}/governor/genproto"
bin_go="$cache/protoc-gen-go-$PROTOC_GEN_GO_VERSION"
bin_grpc="$cache/protoc-gen-go-grpc-$PROTOC_GEN_GO_GRPC_VERSION"
if [ ! -x "$bin_go/protoc-gen-go" ]; then
	echo "genproto: installing protoc-gen-go $PROTOC_GEN_GO_VERSION" >&2
	GOBIN="$bin_go" GOFLAGS= go install "google.golang.org/protobuf/cmd/protoc-gen-go@$PROTOC_GEN_GO_VERSION"
fi
if [ ! -x "$bin_grpc/protoc-gen-go-grpc" ]; then
	echo "genproto: installing protoc-gen-go-grpc $PROTOC_GEN_GO_GRPC_VERSION" >&2
	GOBIN="$bin_grpc" GOFLAGS= go install "google.golang.org/grpc/cmd/protoc-gen-go-grpc@$PROTOC_GEN_GO_GRPC_VERSION"
fi

# With --check, generate into a temporary folder and compare.
gen_root=.
if $check; then
	gen_root=$(mktemp -d)
	trap 'rm -rf "$gen_root"' EXIT
	mkdir -p "$gen_root/api/governorpb"
fi

protoc \
	-I . \
	--plugin=protoc-gen-go="$bin_go/protoc-gen-go" \
	--plugin=protoc-gen-go-grpc="$bin_grpc/protoc-gen-go-grpc" \
	--go_out="$gen_root" --go_opt=paths=source_relative \
	--go-grpc_out="$gen_root" --go-grpc_opt=paths=source_relative \
	api/governorpb/governor.proto

if $check; then
	for f in governor.pb.go governor_grpc.pb.go; do
		if ! cmp -s "$gen_root/api/governorpb/$f" "api/governorpb/$f"; then
			echo "genproto: api/governorpb/$f is out of date; run scripts/genproto.sh" >&2
			exit 1
		fi
	done
	echo "genproto: generated files are up to date" >&2
fi
