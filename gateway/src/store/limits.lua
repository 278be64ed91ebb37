-- The limiter's algorithm for the Redis store: the same steps as `KeyState::check` in
-- gateway/src/limits.rs, run atomically inside Redis, so any number of gateways decide as one.
-- `tests/limit_stores.rs` drives this script and the Rust code through one table of cases.
--
-- KEYS[1]  the key's state: a hash `as:lim:{<key id>}` (one key, so one hash slot)
-- ARGV     now_ms, per_minute, per_day, ban threshold, ban base_ms, ban max_ms,
--          ban repeat_window_ms, ttl_ms
-- Returns  "verdict minute_remaining minute_reset_ms day_remaining ban_until_ms", five
--          decimal integers in one string (a gateway reads one string in about a third of
--          the instructions an array of five integer replies takes):
--          verdict 0 admitted, 1 rate limited, 2 quota exceeded, 3 banned, 4 banned by this
--          very request. Both windows are returned, not only the one the headers describe
--          (the gateway picks that): they are where a gateway starts from if Redis goes away.
-- Numbers are Lua doubles: exact up to 2^53, which bounds limits (see plans.rs MAX_LIMIT), and
-- `%d` writes every one of them in full (`tostring` would write 1e+14 from 14 digits on).

local MINUTE_MS = 60000
local DAY_MS = 86400000

local now = tonumber(ARGV[1])
local per_minute = tonumber(ARGV[2])
local per_day = tonumber(ARGV[3])
local threshold = tonumber(ARGV[4])
local base_ms = tonumber(ARGV[5])
local max_ms = tonumber(ARGV[6])
local repeat_ms = tonumber(ARGV[7])
local ttl_ms = tonumber(ARGV[8])

local f = redis.call('HMGET', KEYS[1], 'ms', 'mc', 'rf', 'd', 'dc', 'bu', 'bl', 'lv')
local minute_start = tonumber(f[1])          -- nil: no window opened yet
local minute_count = tonumber(f[2]) or 0
local refused = tonumber(f[3]) or 0
local day = tonumber(f[4]) or 0
local day_count = tonumber(f[5]) or 0
local ban_until = tonumber(f[6]) or 0
local ban_last = tonumber(f[7])              -- nil: never banned
local ban_level = tonumber(f[8]) or 0

if minute_start == nil or now >= minute_start + MINUTE_MS then
  minute_start = now
  minute_count = 0
  refused = 0
end
local today = math.floor(now / DAY_MS)
if day ~= today then
  day = today
  day_count = 0
end

-- Where the key stands after this request, for the reply.
local function standing(verdict)
  return string.format('%d %d %d %d %d', verdict, math.max(0, per_minute - minute_count),
                       minute_start + MINUTE_MS, math.max(0, per_day - day_count), ban_until)
end

-- A ban in force refuses at once and changes nothing (the windows above are not saved).
if now < ban_until then
  return standing(3)
end

local function save()
  local fields = { 'ms', minute_start, 'mc', minute_count, 'rf', refused, 'd', day,
                   'dc', day_count, 'bu', ban_until, 'lv', ban_level }
  if ban_last ~= nil then
    fields[#fields + 1] = 'bl'
    fields[#fields + 1] = ban_last
  end
  redis.call('HSET', KEYS[1], unpack(fields))
  redis.call('PEXPIRE', KEYS[1], ttl_ms)
end

local minute_left = math.max(0, per_minute - minute_count)
local day_left = math.max(0, per_day - day_count)
local verdict
if minute_left > 0 and day_left > 0 then
  minute_count = minute_count + 1
  day_count = day_count + 1
  verdict = 0
else
  refused = refused + 1
  if refused > threshold then
    refused = 0
    -- BanState::impose: a ban within the repeat window of the last one doubles, up to max.
    if ban_last ~= nil and now - ban_last < repeat_ms then
      ban_level = ban_level + 1
    else
      ban_level = 0
    end
    local length = math.min(base_ms * math.pow(2, math.min(ban_level, 40)), max_ms)
    ban_last = now
    ban_until = now + length
    save()
    return standing(4)
  end
  if day_left == 0 then verdict = 2 else verdict = 1 end
end
save()
return standing(verdict)
