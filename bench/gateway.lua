-- wrk script for bench/gateway_bench.py: builds each request's body from pieces on disk.
-- Arguments (after `--`): DIR MODE SESSIONS TURNS SALT [BEARER]
--   DIR holds head_0..head_N and turn_1..turn_TURNS (written by gateway_bench.py);
--   MODE "grow": SESSIONS conversations per wrk thread in round robin (the thread id is part
--        of each session's id: T threads hold T x SESSIONS sessions), each request one turn
--        longer than that session's previous one (head_0 .. id .. head_1 [.. id .. head_N] .. turn_1 .. turn_k
--        .. "]}"), a new session after TURNS turns;
--   MODE "first": every request is the first (full-length) request of a new session.
-- done() prints one line "WRKJSON {...}" with requests, duration, p50/p99 (microseconds), errors.

local counter = 0
local pieces = {}
local heads = {}
local mode, sessions, turns, salt
local headers = {}

function setup(thread)
  setup_threads = (setup_threads or 0) + 1
  thread:set("tid", setup_threads)
end

local function slurp(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

function init(args)
  local dir = args[1]
  mode, sessions, turns, salt = args[2], tonumber(args[3]), tonumber(args[4]), args[5]
  local i = 0
  while true do
    local f = io.open(dir .. "/head_" .. i, "rb")
    if not f then break end
    f:close()
    heads[#heads + 1] = slurp(dir .. "/head_" .. i)
    i = i + 1
  end
  for k = 1, turns do pieces[k] = slurp(dir .. "/turn_" .. k) end
  headers["content-type"] = "application/json"
  headers["anthropic-version"] = "2023-06-01"
  headers["x-api-key"] = "bench-key"
  if args[6] then headers["authorization"] = "Bearer " .. args[6] end
end

function request()
  local i = counter
  counter = counter + 1
  local slot = i % sessions
  local round = math.floor(i / sessions)
  local turn, gen
  if mode == "first" then
    turn, gen = turns, round
  else
    turn, gen = round % turns + 1, math.floor(round / turns)
    if turns == 0 then turn = 0 end
  end
  local id = salt .. "-" .. tostring(tid) .. "-" .. slot .. "-" .. gen
  local parts = {heads[1]}
  for k = 2, #heads do
    parts[#parts + 1] = id
    parts[#parts + 1] = heads[k]
  end
  for k = 1, turn do parts[#parts + 1] = pieces[k] end
  parts[#parts + 1] = "]}"
  return wrk.format("POST", "/v1/messages", headers, table.concat(parts))
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests":%d,"duration_us":%d,"p50_us":%d,"p99_us":%d,"errors":%d,"status":%d}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.connect + e.read + e.write + e.timeout, e.status))
end
