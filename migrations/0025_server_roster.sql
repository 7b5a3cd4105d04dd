-- Every serving process keeps the orders it accepted in memory until settlement has
-- committed them (src/sale/kept.rs). A rebuild of a sale's Redis state (after a
-- wipe, a restart or a failover) asks every live server for them first, so that an
-- order Redis lost before settlement read it reaches Postgres anyway
-- (src/roster.rs): the rebuild inserts a request, each live server writes what it
-- keeps of that sale and records the request as seen, and the rebuild reads
-- Postgres once every live server has.
CREATE TABLE server_roster (
    id uuid PRIMARY KEY,
    started_at timestamptz NOT NULL DEFAULT now(),
    -- Written every second while the server runs: a server whose beat is older
    -- than the roster's liveness window is not waited for.
    beat_at timestamptz NOT NULL DEFAULT now(),
    -- The last flush request this server has answered.
    seen bigint NOT NULL DEFAULT 0,
    -- When a rebuild stopped waiting for this server: later rebuilds wait for it
    -- again only once it has beaten since.
    missed_at timestamptz
);

CREATE TABLE flush_requests (
    id bigserial PRIMARY KEY,
    sale_id bigint NOT NULL,
    at timestamptz NOT NULL DEFAULT now(),
    -- Set when the rebuild stops waiting and reads Postgres: a server that writes
    -- kept orders holds the open requests of their sale FOR SHARE and writes
    -- nothing for a closed one (the rebuild did without them: writing them now
    -- could sell a unit twice).
    closed_at timestamptz
);
