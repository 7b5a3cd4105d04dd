-- One rate-limit policy for one subject (the sign-in and sign-up routes; the buy
-- and vote routes check theirs inside their decision scripts).
-- See limit_script in lua/lib/limits.lua for KEYS and ARGV.
-- Returns {verdict, remaining, wait ms, reset ms, now}; verdict:
--   1 allowed   0 denied   -1 never (the policy can never allow this request)
return limit_script()
