-- One rate-limit policy for one subject (the sign-in and sign-up routes; the buy
-- and vote routes check theirs inside their decision scripts).
-- See limit_script in lua/lib/limits.lua for KEYS and ARGV.
return limit_script()
