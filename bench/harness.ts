/**
 * Issue 46's independent harness, exactly as a skeptic runs it: orgauth as `npm start` runs it
 * (dist/bundle/server.js, NODE_ENV=production, LOG_LEVEL=warn, API_RATE_LIMIT=0, on PostgreSQL)
 * and node-oidc-provider (bench/peer-oidc-provider.ts: its in-memory adapter, one confidential
 * client, resource indicators with a default resource whose tokens are ES256 JWTs) each in a
 * process of its own, and the load generator (bench/load.ts: autocannon, 20 connections, POST
 * /oauth/token with a form body and HTTP Basic, keep-alive) in a third. 2 s of warm-up each, then
 * 3 rounds of 8 s alternating orgauth and the peer; the ratio is the median of the three rounds'
 * ratios of average requests a second, and any answer that is not 2xx fails the run. Beside
 * them, in each round, the floor (bench/floor-server.ts: Fastify and the same signing thread,
 * no token logic) against the same peer round: how far the machine lets any Node.js server go.
 *
 * Also the start-up rows: from spawn to `/healthz` answering, the same production process.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import path from 'node:path';

export interface HarnessRound {
  orgauth: number;
  peer: number;
  ratio: number;
  /** The floor (bench/floor-server.ts) in the same round, and its ratio to the peer. */
  floor?: number;
  floorRatio?: number;
}

export interface HarnessResult {
  rounds: HarnessRound[];
  ratio: number;
  /** The median of the floor's per-round ratios to the peer, when it ran. */
  floorRatio?: number;
  /** What failed the run: a non-2xx answer or a connection error, on which side. */
  failures: string[];
}

/** orgauth as `npm start` runs it, in production mode; resolves once /healthz answers, with the time that took. */
export async function startProductionServer(root: string, env: { databaseUrl: string; secretKey: string; port: number; nodeFlags?: string[] }): Promise<{ child: ChildProcess; readyMs: number }> {
  const started = performance.now();
  const child = spawn(process.execPath, [...(env.nodeFlags ?? []), path.join(root, 'dist/bundle/server.js')], {
    cwd: root,
    env: {
      PATH: process.env.PATH,
      NODE_ENV: 'production',
      LOG_LEVEL: 'warn',
      API_RATE_LIMIT: '0',
      DATABASE_URL: env.databaseUrl,
      SECRET_KEY: env.secretKey,
      PORT: String(env.port),
      ISSUER: `http://127.0.0.1:${env.port}`,
    },
    stdio: ['ignore', 'ignore', 'inherit'],
  });
  let exited: number | null | undefined;
  child.once('exit', (code) => (exited = code));
  // What a skeptic's script does: ask /healthz until it answers (every 20 ms: the resolution of the measurement).
  for (;;) {
    if (exited !== undefined) throw new Error(`orgauth exited with ${exited} before /healthz answered`);
    try {
      const res = await fetch(`http://127.0.0.1:${env.port}/healthz`);
      if (res.status === 200) return { child, readyMs: performance.now() - started };
    } catch {
      // Not listening yet.
    }
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

/** The median of `values` (the upper one of an even count): the bench's one way to sum up rounds. */
export const median = (values: number[]): number => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)]!;

interface Side {
  name: 'orgauth' | 'peer' | 'floor';
  url: string;
  body: string;
  basic: string;
}

/** One run of the load generator in its own process. */
function load(root: string, side: Side, seconds: number): Promise<{ rps: number; non2xx: number; errors: number }> {
  const spec = {
    url: side.url,
    body: side.body,
    headers: { 'content-type': 'application/x-www-form-urlencoded', authorization: side.basic },
    connections: 20,
    seconds,
  };
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [path.join(root, 'dist/bench/load.js'), JSON.stringify(spec)], { stdio: ['ignore', 'pipe', 'inherit'] });
    let out = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    child.once('exit', (code) => {
      if (code !== 0) return reject(new Error(`the load generator exited with ${code}`));
      resolve(JSON.parse(out) as { rps: number; non2xx: number; errors: number });
    });
  });
}

/**
 * The harness's rounds against servers already running. `quick`: CI's check that it runs (0.5 s
 * of warm-up, one round of 1 s).
 */
export async function independentHarness(
  root: string,
  sides: { orgauth: { port: number; basic: string; organizationId: number }; peer: { port: number; basic: string }; floor?: { port: number; basic: string } },
  quick: boolean,
): Promise<HarnessResult> {
  const orgauth: Side = {
    name: 'orgauth',
    url: `http://127.0.0.1:${sides.orgauth.port}/oauth/token`,
    body: `grant_type=client_credentials&scope=contacts.read&organization_id=${sides.orgauth.organizationId}`,
    basic: sides.orgauth.basic,
  };
  const peer: Side = { name: 'peer', url: `http://127.0.0.1:${sides.peer.port}/oauth/token`, body: 'grant_type=client_credentials&scope=contacts.read', basic: sides.peer.basic };
  // The floor takes orgauth's body; it runs after the two measured sides, so their rounds alternate as before.
  const floor: Side | undefined = sides.floor && { ...orgauth, name: 'floor', url: `http://127.0.0.1:${sides.floor.port}/oauth/token`, basic: sides.floor.basic };
  const failures: string[] = [];
  const measured = async (side: Side, seconds: number) => {
    const r = await load(root, side, seconds);
    if (r.non2xx > 0 || r.errors > 0) failures.push(`${side.name}: ${r.non2xx} answers not 2xx, ${r.errors} errors`);
    return r.rps;
  };
  const warmup = quick ? 0.5 : 2;
  await measured(orgauth, warmup);
  await measured(peer, warmup);
  if (floor) await measured(floor, warmup);
  const rounds: HarnessRound[] = [];
  for (let i = 0; i < (quick ? 1 : 3); i++) {
    const a = await measured(orgauth, quick ? 1 : 8);
    const b = await measured(peer, quick ? 1 : 8);
    const round: HarnessRound = { orgauth: a, peer: b, ratio: a / b };
    if (floor) {
      round.floor = await measured(floor, quick ? 1 : 8);
      round.floorRatio = round.floor / b;
    }
    rounds.push(round);
  }
  return { rounds, ratio: median(rounds.map((r) => r.ratio)), ...(floor ? { floorRatio: median(rounds.map((r) => r.floorRatio!)) } : {}), failures };
}
