-- value: the lock key holds "<token>.<attempt>:<fence>:<owner>". The
-- attempt (see acquire) says which try of the holder set the key; the
-- fence and owner are there for Inspect, List and Break, which read them
-- without asking the holder. The owner comes last: it may contain ':'.

-- attempt_of returns the "<token>.<attempt>" of a lock value.
local function attempt_of(v)
  return string.match(v, '^[^:]*')
end

-- fence_of returns the fence of a lock value, as a decimal string.
local function fence_of(v)
  return string.match(v, '^[^:]*:(%d+)')
end
