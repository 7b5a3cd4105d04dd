//! The batch scripts take their limits a policy at a time while nobody is refused
//! (`limits_batch_take`, lua/lib/limits_batch.lua) and request by request from the
//! first refusal (`limits_take`, lua/lib/limits.lua). Both must decide every
//! request exactly as `limits_take` alone does: the same requests counted, the same
//! remaining answered for each, the same states left, and the same subjects
//! written; and every taken request's reset, as its algorithm gives it, must be the
//! one the reply carries once per batch (`limits_batch_resets`). Checked here in
//! Redis's own Lua over seeded random batches: sliding logs and counters alone and
//! together, subjects repeated within a batch, states fresh, live, stale and of the
//! previous window, limits that refuse early, late and never; and a batch with a
//! fixed window, which takes nothing the fast way.

use crate::helpers::{RedisNamespace, lua_limits_library};

const NOW: i64 = 1_700_000_012_345;

const CHECK: &str = r#"
local now = tonumber(ARGV[1])
local batches = tonumber(ARGV[2])
local seed = 12345
local function rnd(n)
  seed = (seed * 16807) % 2147483647
  return seed % n + 1
end
local function log(...)
  local t = {}
  for i, x in ipairs({...}) do t[i] = string.format('%013d', x) end
  return table.concat(t)
end
-- A random state text of a subject under `alg` (nil: none).
local function state_text(alg, window)
  local r = rnd(8)
  if r > 5 then return nil end
  if alg == 'sl' then
    if r == 2 then return log(now - window - 5) end
    if r == 3 then return log(now - window + 10, now - 3) end
    if r == 4 then return log(now - 7) end
    return log(now - window + 1, now - 20, now - 10, now - 5)
  elseif alg == 'sc' then
    local w = math.floor(now / window)
    if r == 2 then return w .. ' ' .. rnd(3) .. ' ' .. (rnd(4) - 1) end
    if r == 3 then return (w - 1) .. ' ' .. rnd(6) .. ' 2' end
    if r == 4 then return (w - 2) .. ' 5 5' end
    return w .. ' 0 ' .. rnd(3)
  end
  local w = math.floor(now / window)
  return w .. ' ' .. (rnd(3) - 1)
end
local SHAPES = {{'sl'}, {'sc'}, {'sl', 'sc'}, {'sc', 'sl'}, {'sl', 'sl'}, {'sl', 'fw'}}
local function copy_states(read)
  local t = {}
  for id, s in pairs(read) do t[id] = s end
  return t
end
local function text_of(alg, s)
  if not s then return '-' end
  return LIMIT_TEXT[alg](s)
end
local fast_taken, exact_taken, refused, wrong = 0, 0, 0, {}
for b = 1, batches do
  local shape = SHAPES[(b - 1) % #SHAPES + 1]
  local P = #shape
  local policies = {}
  for p, alg in ipairs(shape) do
    local window = ({1000, 2000, 10000})[rnd(3)]
    local limit = ({1, 3, 5, 40, 1000, 1000, 1000, 1000})[rnd(8)]
    policies[p] = {alg, limit, window, 0, true, limit_taker(alg), limit_taken_of(alg)}
  end
  local n = rnd(40)
  local pool = ({1, 3, 10, 60, 60, 60})[rnd(6)]
  local subjects, counted = {}, {}
  -- Some items not counted (a replay), as batch_admit skips them.
  for i = 1, n do
    if rnd(10) > 1 then counted[#counted + 1] = i end
    for p = 1, P do subjects[(i - 1) * P + p] = 'u' .. rnd(pool) end
  end
  -- The states as limits_preload leaves them: per policy, each subject once, in
  -- the order of first use, with the state read (false: none).
  local read, ids, read_list = {}, {}, {}
  for p = 1, P do
    read[p], ids[p], read_list[p] = {}, {}, {}
    for _, i in ipairs(counted) do
      local id = subjects[(i - 1) * P + p]
      if read[p][id] == nil then
        local text = state_text(shape[p], policies[p][3])
        read[p][id] = text and LIMIT_READ[shape[p]](text) or false
        ids[p][#ids[p] + 1] = id
        read_list[p][#ids[p]] = read[p][id]
      end
    end
  end
  local function cache_of()
    local c = {tables = {}, subjects = ids, read = read_list, policies = policies}
    for p = 1, P do c.tables[p] = copy_states(read[p]) end
    return c
  end
  -- A taken request's numbers: its remaining per policy as the reply carries them
  -- (limits_append_taken), then whether each policy's reset, as the algorithm
  -- gives it, is the batch's (limits_batch_resets), which the reply carries instead.
  local resets = limits_batch_resets(policies, now)
  local function taken_numbers(before, after, base)
    local out = {}
    limits_append_taken(out, 0, policies, before, after, base, now)
    for p = 1, P do
      local policy = policies[p]
      local _, reset = policy[7](before[base + p], after[base + p], now, policy[2],
        policy[3], policy[4])
      out[#out + 1] = reset == resets[p] and 'batch reset' or
        ('reset ' .. reset .. ', the batch ' .. resets[p])
    end
    return table.concat(out, ',')
  end
  -- The exact path alone.
  local exact, e_after, e_before, states = cache_of(), {}, {}, {}
  local e_out = {}
  for _, i in ipairs(counted) do
    local ok = limits_take(exact, subjects, (i - 1) * P, policies, now, states, e_after, e_before)
    if ok then
      e_out[i] = taken_numbers(e_before, e_after, (i - 1) * P)
    else
      e_out[i] = 'refused'
    end
  end
  -- A policy at a time, then the exact path from the first refusal.
  local fast, f_after, f_before = cache_of(), {}, {}
  local upto, rem = limits_batch_take(fast, subjects, policies, counted, now, f_after)
  local f_out = {}
  for k, i in ipairs(counted) do
    if k < upto then
      local out = {}
      for p = 1, P do
        out[#out + 1] = rem[(i - 1) * P + p]
      end
      for _ = 1, P do
        out[#out + 1] = 'batch reset'
      end
      f_out[i] = table.concat(out, ',')
      fast_taken = fast_taken + 1
    else
      local ok = limits_take(fast, subjects, (i - 1) * P, policies, now, states, f_after, f_before)
      if ok then
        f_out[i] = taken_numbers(f_before, f_after, (i - 1) * P)
        exact_taken = exact_taken + 1
      else
        f_out[i] = 'refused'
        refused = refused + 1
      end
    end
  end
  for _, i in ipairs(counted) do
    if e_out[i] ~= f_out[i] then
      wrong[#wrong + 1] = 'batch ' .. b .. ' item ' .. i .. ': ' .. f_out[i] .. ' not ' .. e_out[i]
    elseif string.find(e_out[i], 'the batch', 1, true) then
      wrong[#wrong + 1] = 'batch ' .. b .. ' item ' .. i .. ': ' .. e_out[i]
    end
  end
  for p = 1, P do
    for k, id in ipairs(ids[p]) do
      local e, f = exact.tables[p][id], fast.tables[p][id]
      if text_of(shape[p], e) ~= text_of(shape[p], f) then
        wrong[#wrong + 1] = 'batch ' .. b .. ' policy ' .. p .. ' ' .. id .. ': ' ..
          text_of(shape[p], f) .. ' not ' .. text_of(shape[p], e)
      end
      -- limits_write writes a subject whose state is not the one read.
      if (e ~= read_list[p][k]) ~= (f ~= read_list[p][k]) then
        wrong[#wrong + 1] = 'batch ' .. b .. ' policy ' .. p .. ' ' .. id .. ': written ' ..
          tostring(f ~= read_list[p][k])
      end
    end
  end
end
return {fast_taken, exact_taken, refused, table.concat(wrong, '\n')}
"#;

#[tokio::test]
async fn a_batch_taken_a_policy_at_a_time_decides_as_request_by_request() {
    let lab = RedisNamespace::new().await;
    let mut source = lua_limits_library();
    source.push_str(CHECK);
    let (fast, exact, refused, wrong): (i64, i64, i64, String) = redis::Script::new(&source)
        .key(lab.keys.rate_limit("unused", "x"))
        .arg(NOW)
        .arg(1500)
        .invoke_async(&mut lab.redis.clone())
        .await
        .expect("check script");
    eprintln!("{fast} taken a policy at a time, {exact} request by request, {refused} refused");
    assert_eq!(wrong, "", "requests or states that differ");
    // The batches exercise both paths and refusals.
    assert!(fast > 1000, "{fast} taken a policy at a time");
    assert!(
        exact > 100,
        "{exact} taken request by request after a refusal"
    );
    assert!(refused > 100, "{refused} refused");
}
