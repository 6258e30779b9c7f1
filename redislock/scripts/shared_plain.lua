-- shared_plain: the queue's part of shared_acquire for a plain Driver:
-- there is no queue.
local fair = false
local function queued(now)
  return 0, false
end
local function refused(now, us)
  settle(KEYS[1], KEYS[2], now)
  return 0
end
local function granted()
end
