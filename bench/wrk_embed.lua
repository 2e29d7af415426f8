-- wrk script: POST one JSON body per request, cycling through a file of bodies; counts answers by status.
--
--   wrk -t2 -c64 -d10s --latency -s bench/wrk_embed.lua http://127.0.0.1:8080 -- BODIES_FILE [PATH]
--
-- BODIES_FILE holds one JSON body per line (bench/served.py writes 256 distinct 75-token texts in
-- TEI's {"inputs": ...} shape); PATH defaults to /embed. Each wrk thread starts at its own place in
-- the list, so the threads do not send the same text at the same time. Without arguments it sends
-- one built-in 75-token text (for a quick manual run; every request is then the same text).
--
-- Last line printed (parsed by bench/served.py), latencies in ms:
--   RESULT requests= seconds= ok= busy= other= p50= p90= p99= max= p99_ok_bound= connect= read= write= timeout=
-- ok: 200 answers, busy: 429 answers, other: any other status. wrk's latency histogram covers every
-- answer whatever its status, and the `response` hook is told no connection or time, so the 200s'
-- own latency cannot be recorded here. p99_ok_bound is an upper bound on it: the 200s are a share f
-- of the answers, so at most 1 % of them can lie above the overall percentile 100 * (1 - 0.01 f);
-- it equals the 200s' p99 when every non-200 answer was faster than every 200.

local DEFAULT_BODY = '{"inputs": "Retrieval augmented generation systems embed questions and passages into vectors '
  .. 'so that a nearest neighbour search can find the passages that answer a question. The embedding service must '
  .. 'keep its latency low while many users ask at once, and it should use every processor of the server it runs '
  .. 'on, the accelerator first and the idle CPU cores when a burst arrives. Retrieval augmented generation"}'

local threads = {}
local thread_count = 0

function setup(thread)
  thread:set("thread_index", thread_count)
  thread_count = thread_count + 1
  table.insert(threads, thread)
end

local requests = {}
local position = 1
ok, busy, other = 0, 0, 0

function init(args)
  local path = args[2] or "/embed"
  local headers = { ["Content-Type"] = "application/json" }
  local bodies = {}
  if args[1] then
    local file = assert(io.open(args[1], "r"))
    for line in file:lines() do
      if #line > 0 then table.insert(bodies, line) end
    end
    file:close()
  else
    bodies = { DEFAULT_BODY }
  end
  for i, body in ipairs(bodies) do
    requests[i] = wrk.format("POST", path, headers, body)
  end
  -- Spread the threads' starting places over the list.
  position = ((thread_index or 0) * 97) % #requests + 1
end

function request()
  local r = requests[position]
  position = position % #requests + 1
  return r
end

function response(status, headers, body)
  if status == 200 then
    ok = ok + 1
  elseif status == 429 then
    busy = busy + 1
  else
    other = other + 1
  end
end

function done(summary, latency, requests_)
  local n_ok, n_busy, n_other = 0, 0, 0
  for _, thread in ipairs(threads) do
    n_ok = n_ok + thread:get("ok")
    n_busy = n_busy + thread:get("busy")
    n_other = n_other + thread:get("other")
  end
  local answered = n_ok + n_busy + n_other
  local bound = -1
  if n_ok > 0 and answered > 0 then
    bound = latency:percentile(100 * (1 - 0.01 * n_ok / answered)) / 1000
  end
  local e = summary.errors
  io.write(string.format(
    "RESULT requests=%d seconds=%.3f ok=%d busy=%d other=%d p50=%.2f p90=%.2f p99=%.2f max=%.2f "
      .. "p99_ok_bound=%.2f connect=%d read=%d write=%d timeout=%d\n",
    summary.requests, summary.duration / 1e6, n_ok, n_busy, n_other,
    latency:percentile(50) / 1000, latency:percentile(90) / 1000, latency:percentile(99) / 1000,
    latency.max / 1000, bound, e.connect, e.read, e.write, e.timeout))
end
