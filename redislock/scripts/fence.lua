-- fence: the next fence of a name, shared by the scripts that grant a lock
-- (acquire, and the default mode's hand-off).
--
-- The fence is max(counter + 1, server clock in microseconds): a clock
-- floor. The counter expires `retention` after the name's last grant, so
-- a released name leaves nothing behind for long; when it is gone (or the
-- server lost it: a restart without persistence, a failover to a replica
-- that missed the last writes) it starts again at the clock, which is above
-- every fence it gave as long as the clock did not step back by more than
-- that: every fence was at most the clock of its grant, since no name is
-- granted a million times a second. On a busy name the floor wins on most
-- grants; the counter when two grants share a microsecond. One read and
-- one write: counter is the counter's value if the caller read it (false
-- when missing), nil to read it here.
-- Microseconds since 1970 stay below 2^53 until the year 2255, so Lua's
-- numbers are exact. Returns the fence as a decimal string.
--
-- A Quorum's servers round the floor down to a multiple of fence_grain
-- microseconds (its script sets it; at most half the retention, so the
-- argument above holds with the allowance reduced by one grain): servers
-- whose clocks agree within the grain give a new name the same fence, and
-- the acquisition needs no second round trip to raise the others to it.
local fence_grain = 1
-- now_us is the server's clock in microseconds: read once by a script
-- that grants several names (TIME costs a script like any command).
local function now_us()
  local t = redis.call('TIME')
  return t[1] * 1000000 + t[2]
end

-- fence_after returns the next fence after counter (false when missing)
-- without writing it, as a decimal string and as a number: the caller
-- writes it when it grants. us is now_us(), read here when nil. Computed
-- once, in numbers (a string's arithmetic is Lua's coercion): each
-- conversion more is measurable in a script run on every grant.
local function fence_after(counter, us)
  us = us or now_us()
  us = us - us % fence_grain
  local c = tonumber(counter or '')
  if c and c >= us then
    us = c + 1
  end
  return string.format('%d', us), us
end

local function next_fence(key, retention, counter)
  if counter == nil then
    counter = redis.call('GET', key)
  end
  local fence = fence_after(counter)
  redis.call('SET', key, fence, 'PX', retention)
  return fence
end
