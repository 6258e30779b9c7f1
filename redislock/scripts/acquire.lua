-- acquire: take the lock for a token and advance the fencing counter in the
-- same atomic step, so that the lock and its fence can never disagree.
--
-- KEYS[1]  lock key      {E}:lock   (holds "<token>.<attempt>:<fence>:<owner>",
--                                    see value.lua)
-- KEYS[2]  fence counter {E}:fence  (same hash slot: the {E} hash tag)
-- ARGV[1]  "<token>.<attempt>": the token and which attempt of it this is
--          (attempts of one token are numbered in increasing order)
-- ARGV[2]  TTL in milliseconds
-- ARGV[3]  "<token>."
-- restart_delay  (set by the caller's prefix) milliseconds: see below
-- retention      (set by the caller's prefix) milliseconds the fence
--                counter outlives the name's last grant
-- owner          (set by the caller's prefix) the holder's Claim.Owner
--
-- Returns the fence (> 0) when the token holds the lock, 0 when another
-- token holds it, -n when the server may have forgotten a holder (below):
-- try again in n milliseconds.
--
-- A restarted server has forgotten the locks granted since its last
-- snapshot (all of them without persistence) while their holders still
-- run, each until its TTL after its last refresh. So a server that
-- started less than a TTL ago grants nothing (Redlock's "delayed
-- restart", kept by the server itself), whether or not it has the name's
-- fence counter: one restored from a snapshot (RDB, or an AOF that missed
-- its last second) predates the grants it forgot. This assumes a name is
-- locked with one TTL, or a shorter one after a longer. restart_delay is
-- that TTL, or less if the user said so (a server that persists every
-- write needs none: 0; upproof.go's variant sets it to 0 once the
-- server's uptime is proven).
-- The check runs only when the script would grant: a refusal needs none.
local counter = redis.call('GET', KEYS[2]) -- for the fence
-- The fence: see fence.lua. A free lock (the common case) is taken by SET
-- NX, with nothing read first; the counter is written only on a grant.
local fence, fence_n = fence_after(counter)
local value = ARGV[1] .. ':' .. fence .. ':' .. owner
local free = redis.call('SET', KEYS[1], value, 'NX', 'PX', ARGV[2])
if not free then
  -- value.lua's attempt_of and fence_of, inline: the plain acquire
  -- scripts leave value.lua out (each function is made on every run).
  local held, got = string.match(redis.call('GET', KEYS[1]), '^([^:]*):?(%d*)')
  if held == ARGV[1] then
    -- A retry of this very attempt (the reply was lost and the client
    -- sent the script again): report the grant once more, with the fence
    -- it got.
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return tonumber(got) or 0
  end
  if string.sub(held, 1, #ARGV[3]) ~= ARGV[3] then
    return 0 -- another token's
  end
  -- Left by another attempt of the same token. A later attempt's key
  -- stays: this one is a straggler of a try already given up. An earlier
  -- attempt's key (it failed elsewhere) is taken over by this one, with a
  -- new fence (below).
  local theirs = tonumber(string.sub(held, #ARGV[3] + 1))
  local ours = tonumber(string.sub(ARGV[1], #ARGV[3] + 1))
  if theirs and ours and theirs > ours then
    return 0
  end
end
if restart_delay > 0 then
  local up = tonumber(string.match(redis.call('INFO', 'server'), 'uptime_in_seconds:(%d+)') or '')
  -- uptime_in_seconds is the difference of two clock readings in whole
  -- seconds: the server has run for more than up - 1 seconds.
  if up and (up - 1) * 1000 < restart_delay then
    if free then
      redis.call('DEL', KEYS[1]) -- the SET NX above, undone
    end
    return -(restart_delay - (up - 1) * 1000)
  end
end
if not free then
  redis.call('SET', KEYS[1], value, 'PX', ARGV[2])
end
redis.call('SET', KEYS[2], fence, 'PX', retention)
return fence_n
