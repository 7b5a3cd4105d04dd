-- Users, sales and orders. Postgres is the system of record; Redis holds the hot state.

CREATE TABLE users (
    id            BIGSERIAL PRIMARY KEY,
    username      TEXT        NOT NULL UNIQUE,
    password_hash TEXT        NOT NULL,
    is_admin      BOOLEAN     NOT NULL DEFAULT FALSE,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE sales (
    id          BIGSERIAL PRIMARY KEY,
    name        TEXT        NOT NULL,
    description TEXT        NOT NULL DEFAULT '',
    price_cents BIGINT      NOT NULL CHECK (price_cents >= 0),
    -- Units ever offered: initial stock plus top-ups. Units left = stock_total - sold.
    stock_total BIGINT      NOT NULL CHECK (stock_total >= 0),
    starts_at   TIMESTAMPTZ NOT NULL,
    ends_at     TIMESTAMPTZ NOT NULL,
    closed      BOOLEAN     NOT NULL DEFAULT FALSE,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    CHECK (ends_at > starts_at)
);

-- One row per accepted purchase, written by the settlement worker. The primary key
-- and the (sale, user) unique key make every write idempotent.
CREATE TABLE orders (
    id          UUID        PRIMARY KEY,
    sale_id     BIGINT      NOT NULL REFERENCES sales (id),
    user_id     BIGINT      NOT NULL REFERENCES users (id),
    accepted_at TIMESTAMPTZ NOT NULL,
    settled_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    UNIQUE (sale_id, user_id)
);

CREATE INDEX orders_user_id_idx ON orders (user_id);
