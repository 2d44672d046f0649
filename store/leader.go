package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Leadership of several governord processes over one PostgreSQL store.
//
// One row, governor_leader, holds the epoch (a number that only grows), who
// holds it, the address clients should use, and when the lease ends by the
// database's clock. A process becomes the leader by moving the epoch on,
// which it may do only once the lease has ended; the same statement copies
// the new epoch into governor_snapshot, the row every Append moves. A fenced
// Append (Fence) matches that epoch in its own statement, so once a new
// leader has won, the old leader's commits fail (ErrDeposed): its process
// stops as on any failed commit.
//
// The database's clock decides when a lease has ended; a leader's own
// monotonic clock decides when it stops serving: at the time it sent its
// last successful renewal plus the lease, less the drift allowance (Term).
// Since the renewal reached the database after it was sent, the leader stops
// before the database would let anyone else win, as long as the two clocks'
// rates differ by less than the allowance over one lease.

// ErrDeposed: another process has become the leader since this one won its
// epoch; the append or the renewal was refused and nothing was written.
var ErrDeposed = errors.New("deposed: another governord leads a newer epoch")

const postgresLeaderSchema = `
ALTER TABLE governor_snapshot ADD COLUMN IF NOT EXISTS epoch bigint NOT NULL DEFAULT 0;
CREATE TABLE IF NOT EXISTS governor_leader (
	id         smallint PRIMARY KEY CHECK (id = 1),
	epoch      bigint NOT NULL,      -- moved on by each new leader; equals governor_snapshot.epoch
	holder     text NOT NULL,        -- the leading process's random id
	addr       text NOT NULL,        -- where clients reach it
	expires_at timestamptz NOT NULL  -- the lease's end, by the database's clock
);
INSERT INTO governor_leader (id, epoch, holder, addr, expires_at) VALUES (1, 0, '', '', '-infinity') ON CONFLICT (id) DO NOTHING;
`

// campaignSQL moves the epoch on and takes the lease if it has ended, and
// copies the epoch into governor_snapshot in the same statement: from its
// commit on, a fenced Append of an older epoch matches no row. Its row lock
// on governor_snapshot waits for an Append in flight, so that Append either
// commits first (and the new leader's Load sees it) or is refused.
const campaignSQL = `WITH won AS (
	UPDATE governor_leader SET epoch = GREATEST(epoch, (SELECT epoch FROM governor_snapshot WHERE id = 1)) + 1,
		holder = $1, addr = $2, expires_at = clock_timestamp() + $3 * interval '1 microsecond'
	WHERE id = 1 AND expires_at < clock_timestamp()
	RETURNING epoch)
UPDATE governor_snapshot SET epoch = (SELECT epoch FROM won) WHERE id = 1 AND EXISTS (SELECT 1 FROM won)
RETURNING epoch`

const (
	renewSQL = `UPDATE governor_leader SET expires_at = clock_timestamp() + $2 * interval '1 microsecond'
	WHERE id = 1 AND epoch = $1 RETURNING 1`
	resignSQL = `UPDATE governor_leader SET expires_at = '-infinity' WHERE id = 1 AND epoch = $1`
	leaderSQL = `SELECT l.epoch, l.holder, l.addr, l.expires_at > clock_timestamp(),
	CASE WHEN l.expires_at > clock_timestamp() -- '-infinity' (none yet, or resigned) cannot be subtracted
		THEN (EXTRACT(epoch FROM l.expires_at - clock_timestamp()) * 1e6)::bigint ELSE 0 END, s.last_seq
	FROM governor_leader l, governor_snapshot s WHERE l.id = 1 AND s.id = 1`
)

// Term is one won or renewed lease, as the leader may rely on it.
type Term struct {
	Epoch uint64
	// Until is when the leader must stop serving unless it renews first:
	// when the statement that won or renewed was sent, plus the lease, less
	// the drift allowance. It carries a monotonic reading.
	Until time.Time
}

// Valid reports whether the term still allows serving at now.
func (t Term) Valid(now time.Time) bool { return t.Epoch != 0 && now.Before(t.Until) }

// LeaderInfo is the leadership row as the database sees it now.
type LeaderInfo struct {
	Epoch  uint64
	Holder string
	Addr   string
	// Live says the lease has not ended by the database's clock; Left is
	// how long it has to run.
	Live bool
	Left time.Duration
	// LastSeq is the newest seq the log holds.
	LastSeq uint64
}

// Elector campaigns for, renews and gives up the leadership of one
// PostgreSQL store, on connections of its own so that a busy or stuck
// writer never delays a renewal.
type Elector struct {
	pool   *pgxpool.Pool
	holder string
	addr   string
	lease  time.Duration
	drift  time.Duration
}

// electorMaxConns: a renewal, and a read of the row or of the log's tail
// (a standby's) that overlaps it.
const electorMaxConns = 2

// NewElector opens the connections of an Elector for p's database. holder
// names this process (unique among the candidates), addr is where its
// clients reach it, lease is how long a won or renewed lease lasts, and
// drift (less than lease) is how much earlier than that the leader stops.
func (p *Postgres) NewElector(ctx context.Context, holder, addr string, lease, drift time.Duration) (*Elector, error) {
	if holder == "" || lease <= 0 || drift < 0 || drift >= lease {
		return nil, fmt.Errorf("store: elector: holder %q, lease %v, drift %v: want a holder and 0 <= drift < lease", holder, lease, drift)
	}
	cfg := p.cfg.Copy()
	cfg.MaxConns = electorMaxConns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("store: elector: %w", err)
	}
	return &Elector{pool: pool, holder: holder, addr: addr, lease: lease, drift: drift}, nil
}

// Campaign takes the leadership if the current lease has ended. won is
// false, with no error, while another holder's lease runs.
func (e *Elector) Campaign(ctx context.Context) (t Term, won bool, err error) {
	sent := time.Now()
	var epoch int64
	err = e.pool.QueryRow(ctx, campaignSQL, e.holder, e.addr, e.lease.Microseconds()).Scan(&epoch)
	if errors.Is(err, pgx.ErrNoRows) {
		return Term{}, false, nil
	}
	if err != nil {
		return Term{}, false, fmt.Errorf("store: campaign: %w", err)
	}
	return e.term(uint64(epoch), sent), true, nil
}

// Renew extends the lease of epoch. It fails with ErrDeposed once another
// process has won a newer epoch; any other error leaves the term as it was.
func (e *Elector) Renew(ctx context.Context, epoch uint64) (Term, error) {
	sent := time.Now()
	var one int
	err := e.pool.QueryRow(ctx, renewSQL, int64(epoch), e.lease.Microseconds()).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return Term{}, fmt.Errorf("store: renew epoch %d: %w", epoch, ErrDeposed)
	}
	if err != nil {
		return Term{}, fmt.Errorf("store: renew epoch %d: %w", epoch, err)
	}
	return e.term(epoch, sent), nil
}

func (e *Elector) term(epoch uint64, sent time.Time) Term {
	return Term{Epoch: epoch, Until: sent.Add(e.lease - e.drift)}
}

// Resign ends the lease of epoch at once, so that a standby need not wait
// for it. The caller must have stopped serving first.
func (e *Elector) Resign(ctx context.Context, epoch uint64) error {
	if _, err := e.pool.Exec(ctx, resignSQL, int64(epoch)); err != nil {
		return fmt.Errorf("store: resign epoch %d: %w", epoch, err)
	}
	return nil
}

// Leader reads the leadership row.
func (e *Elector) Leader(ctx context.Context) (LeaderInfo, error) {
	var epoch, leftMicros, last int64
	var info LeaderInfo
	err := e.pool.QueryRow(ctx, leaderSQL).Scan(&epoch, &info.Holder, &info.Addr, &info.Live, &leftMicros, &last)
	if err != nil {
		return LeaderInfo{}, fmt.Errorf("store: read the leader: %w", err)
	}
	info.Epoch, info.Left, info.LastSeq = uint64(epoch), time.Duration(leftMicros)*time.Microsecond, uint64(last)
	return info, nil
}

// Close closes the Elector's connections. It does not resign.
func (e *Elector) Close() { e.pool.Close() }

// Fence makes every later Append conditional on epoch being the newest: an
// Append after another process has won a newer epoch fails with
// ErrDeposed. Zero (the default) appends unconditionally, for a governord
// without standbys.
func (p *Postgres) Fence(epoch uint64) { p.epoch.Store(epoch) }

// fencedSQL makes query (an append statement) conditional on the epoch in
// parameter $n and, with notify, makes it notify the followers
// (NotifyChannel) when it appends.
func fencedSQL(query string, n int, notify bool) string {
	const move = "AND last_seq = $2 RETURNING 1)"
	if !notify {
		return strings.Replace(query, move, fmt.Sprintf("AND last_seq = $2 AND epoch = $%d RETURNING 1)", n), 1)
	}
	fenced := fmt.Sprintf("AND last_seq = $2 AND epoch = $%d RETURNING 1),\nnotified AS (SELECT pg_notify('%s', '') FROM moved)", n, NotifyChannel)
	return strings.Replace(query, move, fenced, 1) + " AND EXISTS (SELECT 1 FROM notified)"
}

// NotifyChannel is the channel a fenced Append notifies when it commits.
const NotifyChannel = "governor_events"

// NotifyGap is the least time between two notifications: a busy leader
// commits hundreds of times a second, and a notification per commit wakes
// every follower's PostgreSQL backend and the follower itself each time,
// on the machine the leader's commits need, for reads a follower spaces
// out anyway. A commit that does not notify is read with the next one that
// does, or at the follower's next poll.
const NotifyGap = 50 * time.Millisecond

// Tail is what a standby reads to follow the log: the records after a
// seq, and the sessions table's rows after a session id, as one view.
type Tail struct {
	Records  []Record
	Sessions []Session
	// LastSeq is the newest seq held; SnapshotSeq the snapshot's. A
	// follower whose seq is below SnapshotSeq, with no record following
	// its seq, has fallen behind a snapshot and must Load again.
	LastSeq, SnapshotSeq uint64
}

// ReadTail reads up to limit records after seq after, and the sessions
// whose id is above sessionsAfter, in one read-only transaction.
func (p *Postgres) ReadTail(ctx context.Context, after, sessionsAfter uint64, limit int) (Tail, error) {
	if p.closed.Load() {
		return Tail{}, fmt.Errorf("store: read tail: %w", ErrClosed)
	}
	var t Tail
	err := pgx.BeginTxFunc(ctx, p.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var last, snap int64
		if err := tx.QueryRow(ctx, "SELECT last_seq, seq FROM governor_snapshot WHERE id = 1").Scan(&last, &snap); err != nil {
			return err
		}
		t.LastSeq, t.SnapshotSeq = uint64(last), uint64(snap)
		if t.LastSeq <= after {
			return nil
		}
		rows, err := tx.Query(ctx, "SELECT seq, data FROM governor_events WHERE seq > $1 ORDER BY seq LIMIT $2", int64(after), limit)
		if err != nil {
			return err
		}
		for rows.Next() {
			var seq int64
			var data []byte
			if err := rows.Scan(&seq, &data); err != nil {
				rows.Close()
				return err
			}
			t.Records = append(t.Records, Record{Seq: uint64(seq), Data: data})
		}
		if err := rows.Err(); err != nil {
			return err
		}
		rows, err = tx.Query(ctx, "SELECT id, token_hash FROM governor_sessions WHERE id > $1 ORDER BY id", int64(sessionsAfter))
		if err != nil {
			return err
		}
		for rows.Next() {
			var id int64
			var hash string
			if err := rows.Scan(&id, &hash); err != nil {
				rows.Close()
				return err
			}
			t.Sessions = append(t.Sessions, Session{ID: uint64(id), TokenHash: hash})
		}
		return rows.Err()
	})
	if err != nil {
		return Tail{}, fmt.Errorf("store: read tail: %w", err)
	}
	return t, nil
}

// Listener receives the notifications of fenced Appends on a connection of
// its own.
type Listener struct {
	conn *pgx.Conn
}

// Listen opens a connection that listens on NotifyChannel.
func (p *Postgres) Listen(ctx context.Context) (*Listener, error) {
	conn, err := pgx.ConnectConfig(ctx, p.cfg.ConnConfig.Copy())
	if err != nil {
		return nil, fmt.Errorf("store: listen: %w", err)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+NotifyChannel); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("store: listen: %w", err)
	}
	return &Listener{conn: conn}, nil
}

// Wait returns when a notification arrives. After an error (ctx's end
// among them) the Listener is unusable: close it and listen again.
func (l *Listener) Wait(ctx context.Context) error {
	if _, err := l.conn.WaitForNotification(ctx); err != nil {
		return fmt.Errorf("store: wait for a notification: %w", err)
	}
	return nil
}

// Close closes the Listener's connection.
func (l *Listener) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return l.conn.Close(ctx)
}
