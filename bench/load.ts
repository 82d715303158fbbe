/**
 * The independent harness's load generator (bench/harness.ts), in a process of its own so that it
 * shares no event loop with either server: autocannon against one URL with one fixed request, for
 * a number of seconds; prints one line of JSON: average requests a second, p99 latency, how many
 * answers were not 2xx, and errors.
 *
 *   node dist/bench/load.js '{"url": ..., "body": ..., "headers": {...}, "connections": 20, "seconds": 8}'
 */
import autocannon from 'autocannon';

interface LoadSpec {
  url: string;
  body: string;
  headers: Record<string, string>;
  connections: number;
  seconds: number;
}

const spec = JSON.parse(process.argv[2] ?? '{}') as LoadSpec;
const result = await autocannon({
  url: spec.url,
  method: 'POST',
  body: spec.body,
  headers: spec.headers,
  connections: spec.connections,
  pipelining: 1,
  duration: spec.seconds,
});
process.stdout.write(
  `${JSON.stringify({ rps: result.requests.average, p99: result.latency.p99, non2xx: result.non2xx, errors: result.errors + result.timeouts, total: result.requests.total })}\n`,
);
