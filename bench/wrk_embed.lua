-- wrk script: one 75-token text per request to /embed (TEI shape), closed loop.
-- Usage: wrk -t1 -c32 -d20s --latency -s bench/wrk_embed.lua http://127.0.0.1:8080
wrk.method = "POST"
wrk.path = "/embed"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"inputs": "Retrieval augmented generation systems embed questions and passages into vectors so that a nearest neighbour search can find the passages that answer a question. The embedding service must keep its latency low while many users ask at once, and it should use every processor of the server it runs on, the accelerator first and the idle CPU cores when a burst arrives. Retrieval augmented generation"}'

local status_counts = {}
response = function(status, headers, body)
  status_counts[status] = (status_counts[status] or 0) + 1
end

done = function(summary, latency, requests)
  for _, p in ipairs({50, 90, 99}) do
    io.write(string.format("p%d=%.1fms ", p, latency:percentile(p) / 1000))
  end
  io.write(string.format("rps=%.1f non2xx=%d\n", summary.requests / (summary.duration / 1e6), summary.errors.status))
end
