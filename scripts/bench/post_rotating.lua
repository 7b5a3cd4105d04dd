-- wrk script: POST to the path on the first line of $BENCH_TOKENS, each request
-- with the next user's bearer token (one per line after the path), so every
-- request is a different buyer until the list wraps.
local f = assert(io.open(os.getenv("BENCH_TOKENS")))
local path = f:read("*l")
local tokens = {}
for line in f:lines() do
  tokens[#tokens + 1] = line
end
f:close()
local i = tonumber(os.getenv("BENCH_OFFSET") or "0")
request = function()
  i = i + 1
  local headers = { ["Authorization"] = "Bearer " .. tokens[(i % #tokens) + 1],
                    ["Content-Length"] = "0" }
  return wrk.format("POST", path, headers, nil)
end
