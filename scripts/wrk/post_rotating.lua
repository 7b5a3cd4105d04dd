-- wrk script: POST to the path on the first line of $BENCH_TOKENS, each request
-- with the next user's bearer token (one per line after the path), so every
-- request is a different user until the list wraps. If the first line holds a
-- JSON body after the path ("/api/polls/7/votes {"option_id":12}"), every
-- request sends it. $BENCH_OFFSET (default 0) says where in the list to start.
local f = assert(io.open(os.getenv("BENCH_TOKENS")))
local path, body = f:read("*l"):match("^(%S+) ?(.*)$")
local tokens = {}
for line in f:lines() do
  tokens[#tokens + 1] = line
end
f:close()
local headers = {}
if body == "" then
  body = nil -- wrk.format then sends no body and no Content-Length
else
  headers["Content-Type"] = "application/json"
end
-- Every request is formatted once, in init (after wrk has set the Host header),
-- so that wrk's Lua does nothing per request but hand over the next string: the
-- generator's own CPU stays near what a plain `wrk URL` costs, and it does not
-- take the cores it measures.
local requests, n, i = {}, 0, 0
function init()
  for k, token in ipairs(tokens) do
    headers["Authorization"] = "Bearer " .. token
    requests[k] = wrk.format("POST", path, headers, body)
  end
  n = #requests
  i = tonumber(os.getenv("BENCH_OFFSET") or "0") % n
end
request = function()
  i = i + 1
  if i > n then
    i = 1
  end
  return requests[i]
end
