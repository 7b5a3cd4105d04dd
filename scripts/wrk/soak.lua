-- wrk script of scripts/soak: the requests of post_rotating.lua ($BENCH_TOKENS:
-- the path, then one bearer token per line, each request the next user's), with
-- a pause of $SOAK_DELAY_MS between a connection's requests when set (it paces the
-- fresh buyers, who would otherwise use up their list in seconds), and a count of
-- the answers by status, printed at the end as "status <code> <count>" lines.
dofile("scripts/wrk/post_rotating.lua")

local pause = tonumber(os.getenv("SOAK_DELAY_MS") or "0")
if pause > 0 then
  delay = function()
    return pause
  end
end

statuses = {} -- a global: done() reads each thread's copy through thread:get
response = function(status)
  statuses[status] = (statuses[status] or 0) + 1
end

local threads = {}
setup = function(thread)
  threads[#threads + 1] = thread
end

done = function()
  local total = {}
  for _, thread in ipairs(threads) do
    for status, n in pairs(thread:get("statuses")) do
      total[status] = (total[status] or 0) + n
    end
  end
  for status, n in pairs(total) do
    io.write(string.format("status %d %d\n", status, n))
  end
end
