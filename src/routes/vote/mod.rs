//! HTTP routes of polls: reads, the vote, live results, admin set-up.
//! One file per concern: public reads (`public.rs`), the vote (`ballot.rs`), the
//! voter's own ballot (`mine.rs`), the admin's (`admin.rs`: create, list, show,
//! close, reveal), every vote as CSV (`export.rs`), edit, archive, delete and
//! history (`lifecycle.rs`). This file holds the route table and the OpenAPI group.

mod admin;
mod ballot;
mod export;
mod lifecycle;
mod mine;
mod public;

// Routes under `/api` (see `startup`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(
    public::list,
    public::show,
    public::results,
    public::events,
    ballot::vote,
    mine::my_ballot,
    admin::admin_create,
    admin::admin_list,
    admin::admin_show,
    admin::admin_close,
    admin::admin_reveal,
    export::admin_votes_csv,
    lifecycle::admin_edit,
    lifecycle::admin_archive,
    lifecycle::admin_unarchive,
    lifecycle::admin_delete,
    lifecycle::admin_history
))]
pub(crate) struct Api;

// The vote is registered right after the purchase, before every other route (see
// `crate::routes::sale`): a vote storm's request is matched by the second pattern
// the router tries, not after some forty others.
super::routes! {
    pub fn configure_hot, pub const HOT_ROUTES; mounted "/api";
    post "/polls/{id}/votes" => ballot::vote,
}

super::routes! {
    pub fn configure, pub const ROUTES; mounted "/api";
    get "/polls" => public::list,
    get "/polls/{id}" => public::show,
    get "/polls/{id}/results" => public::results,
    get "/polls/{id}/events" => public::events,
    get "/polls/{id}/my-ballot" => mine::my_ballot,
    post "/admin/polls" => admin::admin_create,
    get "/admin/polls" => admin::admin_list,
    get "/admin/polls/{id}" => admin::admin_show,
    post "/admin/polls/{id}/close" => admin::admin_close,
    post "/admin/polls/{id}/reveal" => admin::admin_reveal,
    get "/admin/polls/{id}/votes.csv" => export::admin_votes_csv,
    patch "/admin/polls/{id}" => lifecycle::admin_edit,
    delete "/admin/polls/{id}" => lifecycle::admin_delete,
    post "/admin/polls/{id}/archive" => lifecycle::admin_archive,
    post "/admin/polls/{id}/unarchive" => lifecycle::admin_unarchive,
    get "/admin/polls/{id}/history" => lifecycle::admin_history,
}
