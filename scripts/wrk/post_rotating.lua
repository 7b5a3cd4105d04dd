-- wrk script: POST to the path on the first line of $BENCH_TOKENS, each request
-- with the next user's bearer token (one per line after the path), so every
-- request is a different user until the list wraps. A token line of the form
-- "PATH TOKEN" sends that request to its own path instead. If the first line holds a
-- JSON body after the path ("/api/polls/7/votes {"option_id":12}"), every
-- request sends it. $BENCH_OFFSET (default 0) says where in the list to start.
-- With $BENCH_KEYS=1 every request carries an Idempotency-Key of its own (the
-- purchase's retry key: "b" and the request's place in the list). $BENCH_METHOD
-- (default POST) is the method of every request (GET: no body is sent). With
-- $BENCH_ADDRESSES=1 every request comes from an address of its own: an
-- `X-Forwarded-For` of 10.x.y.z from its place in the list (the server must trust
-- the loopback as its proxy).
-- $BENCH_READY: see init below.
local f = assert(io.open(os.getenv("BENCH_TOKENS")))
local path, body = f:read("*l"):match("^(%S+) ?(.*)$")
local tokens, paths = {}, {}
for line in f:lines() do
  -- "PATH TOKEN": this request goes to a path of its own (several sales in one run).
  local own_path, token = line:match("^(/%S+) (%S+)$")
  tokens[#tokens + 1] = token or line
  paths[#tokens] = own_path or path
end
f:close()
local headers = {}
local method = os.getenv("BENCH_METHOD") or "POST"
if body == "" or method == "GET" then
  body = nil -- wrk.format then sends no body and no Content-Length
else
  headers["Content-Type"] = "application/json"
end
-- Every request is formatted once and kept: when the list wraps (repeat buyers),
-- wrk's Lua does nothing per request but hand over the next string, so the
-- generator's own CPU stays near what a plain `wrk URL` costs.
local with_keys = os.getenv("BENCH_KEYS") == "1"
local with_addresses = os.getenv("BENCH_ADDRESSES") == "1"
local requests, n = {}, #tokens
local offset = tonumber(os.getenv("BENCH_OFFSET") or "0") % n

local function format(k)
  headers["Authorization"] = "Bearer " .. tokens[k]
  if with_keys then
    headers["Idempotency-Key"] = "b" .. k
  end
  if with_addresses then
    headers["X-Forwarded-For"] = string.format("10.%d.%d.%d", math.floor(k / 65536) % 256,
      math.floor(k / 256) % 256, k % 256)
  end
  return wrk.format(method, paths[k], headers, body)
end

-- The first $BENCH_PREFORMAT requests from the offset (default: up to 100,000) are
-- formatted in init (after wrk has set the Host header): wrk (-t1) runs it before
-- it starts its clock, so formatting a fresh buyer's request, sent only once, is
-- not charged to the run. Any request beyond them is formatted the first time it
-- is sent.
init = function()
  for step = 1, math.min(n, tonumber(os.getenv("BENCH_PREFORMAT") or "100000")) do
    local k = (offset + step - 1) % n + 1
    requests[k] = format(k)
  end
  -- $BENCH_READY (optional): once the formatting is done, wrk's pid is written
  -- there (whole: a file renamed into place), and wrk waits for a line on the FIFO
  -- $BENCH_GO before its clock starts, so that scripts/bench counts CPU time
  -- from the start of the run, not from wrk's launch.
  local ready = os.getenv("BENCH_READY")
  if ready and ready ~= "" then
    local stat = assert(io.open("/proc/self/stat"))
    local pid = stat:read("*n")
    stat:close()
    local f = assert(io.open(ready .. ".tmp", "w"))
    f:write(tostring(pid), "\n")
    f:close()
    assert(os.rename(ready .. ".tmp", ready))
    local go = os.getenv("BENCH_GO")
    if go and go ~= "" then
      local g = assert(io.open(go, "r"))
      g:read("*l")
      g:close()
    end
  end
end

local i = offset
request = function()
  i = i + 1
  if i > n then
    i = 1
  end
  local r = requests[i]
  if not r then
    r = format(i)
    requests[i] = r
  end
  return r
end
