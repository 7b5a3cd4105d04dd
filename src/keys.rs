//! Redis key naming. Every key starts with the configured namespace; all keys one
//! script touches share one hash tag (`{sale:42}`), so every script runs unchanged on
//! Redis Cluster. Only parsed ids reach a key, never user text.

use crate::domain::{PollId, SaleId};

#[derive(Clone, Debug)]
pub struct Keys {
    ns: String,
}

/// The keys of one sale, all in the slot of `{sale:<id>}`.
#[derive(Clone, Debug)]
pub struct SaleKeys {
    /// Hash: `starts_ms`, `ends_ms`, `closed`.
    pub meta: String,
    /// Integer: units left.
    pub stock: String,
    /// The buyers hash: user id -> the order that made them a buyer, from its
    /// 15th character ('' when not known: a buyer folded in from an earlier
    /// version's set). Who bought, and what an `already_bought` names, answered
    /// by the purchase script itself (`lua/purchase_batch.lua`); rebuilt from the
    /// orders. Named `held` since it began beside the set as the held orders.
    pub buyers: String,
    /// An earlier version's set of user ids that bought, folded into
    /// [`SaleKeys::buyers`] by [`crate::sale::legacy`] and then gone.
    pub buyers_legacy: String,
    /// Stream of accepted orders, one entry per decision batch
    /// ([`crate::sale::entry`]), read by the settlement worker: `{sale:N}:accepted`.
    pub orders: String,
    /// The stream earlier versions wrote, one entry per order: `{sale:N}:orders`.
    /// Read (settled, rebuilt from) and removed, never written: a worker of an
    /// earlier version reads it and never sees a batch entry, which it could not
    /// parse (it would acknowledge it unsettled), so a rolling upgrade loses nothing.
    pub orders_legacy: String,
    /// Hash order id -> user id of accepted orders not yet in Postgres.
    pub pending: String,
    /// Hash stock change id -> applied delta: what `lua/stock_change.lua` applied, so
    /// a change is applied once however often it is retried.
    pub changes: String,
    /// Token of the rebuild in progress (see [`crate::recover`]).
    pub rebuild: String,
    /// Hash user id -> units held (sales of more than one per customer only).
    pub units: String,
    /// Integer: units sold (sales of more than one per customer only; a sale of
    /// one per customer counts its buyers hash).
    pub sold: String,
    /// Hash `<user>:<idempotency key>` -> `<quantity>:<code>:<value>:<order id>`: the
    /// answers given to purchases that carried a key (`lua/purchase_batch.lua`),
    /// expiring `purchase_key_ttl` after its last write; rebuilt from the orders.
    pub idem: String,
    /// The waiting room's line (a sale with one, see [`crate::sale::queue`]): sorted
    /// set user id -> place.
    pub queue: String,
    /// Hash: the waiting room's state (`head`, `served`, `credit`, `last_ms`, `seq`,
    /// `joins`, `admitted`, `passed`).
    pub queue_state: String,
    /// Sorted set user id -> expiry ms: admissions not yet used or expired.
    pub queue_open: String,
    /// Hash user id -> expiry ms: every admission ever given (nobody twice).
    pub queue_admitted: String,
    /// Stream of joins not yet copied to Postgres (`queue_places`).
    pub queue_joins: String,
    /// Stream of admissions not yet written to Postgres (`queue_admissions`).
    pub queue_admits: String,
}

/// The keys of one poll, all in the slot of `{poll:<id>}`.
#[derive(Clone, Debug)]
pub struct PollKeys {
    /// Hash: `opens_ms`, `closes_ms`, `closed`, `run`, `ballot` (the ballot
    /// settings, see `lua/vote_batch.lua`).
    pub meta: String,
    /// Set of the poll's option ids.
    pub options: String,
    /// Hash user id -> the voter's ballot as it counts now: who voted, and for
    /// what (`<option>`, or `<seq>|<ballot>`: see `lua/vote_batch.lua`).
    pub voters: String,
    /// Hash option id -> count.
    pub tally: String,
    /// Stream of accepted vote events, read by the settlement worker.
    pub votes: String,
    /// Token of the rebuild in progress (see [`crate::recover`]).
    pub rebuild: String,
    /// Hash `<user>:<Idempotency-Key>` -> the vote's first answer, expiring like a
    /// purchase's keys.
    pub keys: String,
}

impl Keys {
    pub fn new(namespace: &str) -> Self {
        Keys {
            ns: namespace.to_string(),
        }
    }

    pub fn namespace(&self) -> &str {
        &self.ns
    }

    /// A sale's settlement keys alone: its stream, its earlier versions' stream
    /// and its pending hash ([`SaleKeys::orders`], `orders_legacy`, `pending`),
    /// for the settlement worker's listing of every recent sale every 2 s (three
    /// strings a sale, not the eighteen of [`Keys::sale`]).
    pub fn sale_streams(&self, id: SaleId) -> (String, String, String) {
        let base = format!("{}:{{sale:{}}}", self.ns, id);
        (
            format!("{base}:accepted"),
            format!("{base}:orders"),
            format!("{base}:pending"),
        )
    }

    pub fn sale(&self, id: SaleId) -> SaleKeys {
        let base = format!("{}:{{sale:{}}}", self.ns, id);
        SaleKeys {
            meta: format!("{base}:meta"),
            stock: format!("{base}:stock"),
            buyers: format!("{base}:held"),
            buyers_legacy: format!("{base}:buyers"),
            orders: format!("{base}:accepted"),
            orders_legacy: format!("{base}:orders"),
            pending: format!("{base}:pending"),
            changes: format!("{base}:changes"),
            rebuild: format!("{base}:rebuild"),
            units: format!("{base}:units"),
            sold: format!("{base}:sold"),
            idem: format!("{base}:idem"),
            queue: format!("{base}:queue"),
            queue_state: format!("{base}:queue:state"),
            queue_open: format!("{base}:queue:open"),
            queue_admitted: format!("{base}:queue:admitted"),
            queue_joins: format!("{base}:queue:joins"),
            queue_admits: format!("{base}:queue:admits"),
        }
    }

    pub fn poll(&self, id: PollId) -> PollKeys {
        let base = format!("{}:{{poll:{}}}", self.ns, id);
        PollKeys {
            meta: format!("{base}:meta"),
            options: format!("{base}:options"),
            voters: format!("{base}:voters"),
            tally: format!("{base}:tally"),
            votes: format!("{base}:votes"),
            rebuild: format!("{base}:rebuild"),
            keys: format!("{base}:keys"),
        }
    }

    /// The rate-limit state of one policy and subject: `ns:rl:{buy-user:u42}`. The
    /// whole name is the hash tag, so every key may live on its own shard. Both parts
    /// are checked text (a policy name, a user id or a parsed IP), never user input.
    pub fn rate_limit(&self, policy: &str, subject: &str) -> String {
        format!("{}:rl:{{{policy}:{subject}}}", self.ns)
    }

    /// Rate-limit state of one policy and subject for one sale, in the sale's slot,
    /// so the purchase script checks the buy route's limits inside the decision:
    /// `ns:{sale:42}:rl:buy-user:u7`. Both parts are checked text, never user input.
    pub fn sale_rate_limit(&self, sale: SaleId, policy: &str, subject: &str) -> String {
        format!("{}:{{sale:{sale}}}:rl:{policy}:{subject}", self.ns)
    }

    /// The same for one poll (the vote route's limits).
    pub fn poll_rate_limit(&self, poll: PollId, policy: &str, subject: &str) -> String {
        format!("{}:{{poll:{poll}}}:rl:{policy}:{subject}", self.ns)
    }

    /// The stream on which instances announce ended sessions (see
    /// [`crate::auth::session`]): `ns:sessions:ended`.
    pub fn sessions_ended(&self) -> String {
        format!("{}:sessions:ended", self.ns)
    }

    /// The sweep's note of the Redis run it last found whole (see
    /// [`crate::recover::sweep::Sweep`]): `ns:sweep:run`.
    pub fn sweep_marker(&self) -> String {
        format!("{}:sweep:run", self.ns)
    }

    /// A lock for a job named in code (never user text): `ns:lock:{name}`, its own
    /// hash tag. See [`crate::lock`].
    pub fn lock(&self, name: &str) -> String {
        format!("{}:lock:{{{name}}}", self.ns)
    }

    /// A cached view: `ns:cache:{tag}:what`. Give the view the hash tag of the thing it
    /// shows (`sale:42`), so its rebuild lock (`<key>:lock`) shares its slot.
    /// See [`crate::cache`].
    pub fn cache(&self, tag: &str, what: &str) -> String {
        format!("{}:cache:{{{tag}}}:{what}", self.ns)
    }

    /// The cached Postgres record of one sale, in the slot of its live keys.
    /// (`record`, not `view`, since the record's `stock_total` became the units
    /// offered: a record cached by an older binary is never read as one.)
    pub fn sale_view(&self, id: SaleId) -> String {
        self.cache(&format!("sale:{id}"), "record")
    }

    /// The cached publication of one drawn sale's draw (`GET /api/sales/{id}/draw`),
    /// kept a second: a storm of readers at the draw costs a query a second.
    pub fn draw_view(&self, id: SaleId) -> String {
        self.cache(&format!("sale:{id}"), "draw")
    }

    /// The cached moment one drawn sale's draw finished (null until it does), kept
    /// a second: what the sale's views read (`draw_finished_at`), a few bytes where
    /// the publication holds every win.
    pub fn draw_finished(&self, id: SaleId) -> String {
        self.cache(&format!("sale:{id}"), "drawdone")
    }

    /// The cached Postgres record (question, window, options, results setting) of
    /// one poll. (`record`, not `view`, since the record carries who may see the
    /// tallies: a record cached by an older binary, without it, is never read.)
    pub fn poll_view(&self, id: PollId) -> String {
        self.cache(&format!("poll:{id}"), "record")
    }

    /// The cached first page of the sale list (records and the moment of its order).
    pub fn sales_list(&self) -> String {
        self.cache("sales", "records")
    }

    /// Any other key of this deployment, e.g. `ns:ratelimit:...`.
    pub fn other(&self, rest: &str) -> String {
        format!("{}:{rest}", self.ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Id;

    #[test]
    fn sale_keys_share_one_hash_tag() {
        let k = Keys::new("t1").sale(Id::new(42).unwrap());
        for key in [
            &k.meta,
            &k.stock,
            &k.buyers,
            &k.buyers_legacy,
            &k.orders,
            &k.orders_legacy,
            &k.pending,
            &k.changes,
            &k.rebuild,
            &k.units,
            &k.sold,
            &k.idem,
        ] {
            assert!(key.starts_with("t1:{sale:42}:"), "{key}");
        }
    }

    #[test]
    fn the_settlement_listing_names_the_same_keys_as_the_sale() {
        let keys = Keys::new("t1");
        let id = Id::new(42).unwrap();
        let k = keys.sale(id);
        assert_eq!(
            keys.sale_streams(id),
            (k.orders, k.orders_legacy, k.pending)
        );
    }

    #[test]
    fn rate_limit_keys_are_one_hash_tag_each() {
        assert_eq!(
            Keys::new("t1").rate_limit("buy-ip", "2001:db8::/64"),
            "t1:rl:{buy-ip:2001:db8::/64}"
        );
    }

    #[test]
    fn lock_and_cache_keys_are_hash_tagged() {
        let keys = Keys::new("t1");
        assert_eq!(keys.lock("settle:reclaim"), "t1:lock:{settle:reclaim}");
        assert_eq!(
            keys.sale_view(Id::new(42).unwrap()),
            "t1:cache:{sale:42}:record"
        );
        assert_eq!(keys.sales_list(), "t1:cache:{sales}:records");
    }
}
