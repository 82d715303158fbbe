/**
 * The JWS signature work (RFC 7515 §5.1 step 5, §5.2 step 8), off the event loop: checks of the
 * JWTs clients sign (DPoP proofs in helpers/dpop.ts, client assertions in
 * helpers/client-assertion.ts), and the signatures of the tokens this server issues
 * (models/key-store.ts `signJws`). Callers have done everything else (a check's header: the
 * algorithm is one it allows, the key fits it); this only signs or checks the bytes.
 *
 * Where it runs: on one thread of its own (a worker), the signatures and checks that arrive
 * during one turn of the loop sent to it together, and each answered as soon as it is done (an
 * answer held for the rest of its batch left the loop idle meanwhile: 35% of the time under the
 * independent harness, 27% answering each). Checks, measured on the bench's API row (DPoP
 * against bearer, a 2-core machine shared with PostgreSQL and the load):
 * - on the event loop, node:crypto's synchronous verify (ES256 ~48 µs): 0.754 of bearer;
 * - node:crypto's callback form, one libuv thread-pool job per check: 0.783;
 * - this worker: 0.813–0.821 (medians of six rounds each, interleaved in one run).
 * Signatures: docs/performance.md (issue 46). The arithmetic costs the same CPU wherever it
 * runs; a job on the thread pool costs a wake-up of a pool thread each, which the loop pays in
 * time it could serve requests with (node:crypto's callback sign took a fifth of the loop's time
 * under the independent harness), where a batch pays one; and libuv's four pool threads on two
 * cores contend with the loop, where the worker is one. node:crypto still does the arithmetic (three times faster than
 * jose through WebCrypto here). Should the worker fail, the jobs it held, and the next ones until
 * a new worker starts, go to the thread pool.
 */
import { constants, type KeyObject, sign, type SignKeyObjectInput, verify } from 'node:crypto';
import { Worker } from 'node:worker_threads';

/** The asymmetric JWS algorithms (RFC 7518 §3.1, RFC 8037 §3.1) a client may sign with. */
export type JwsAlg = 'ES256' | 'ES384' | 'ES512' | 'PS256' | 'PS384' | 'PS512' | 'RS256' | 'RS384' | 'RS512' | 'EdDSA';

const DIGESTS = { '256': 'sha256', '384': 'sha384', '512': 'sha512' } as const;
const DIGEST_BYTES = { sha256: 32, sha384: 48, sha512: 64 } as const;

const ALGS: readonly JwsAlg[] = ['ES256', 'ES384', 'ES512', 'PS256', 'PS384', 'PS512', 'RS256', 'RS384', 'RS512', 'EdDSA'];

/** node:crypto's digest and options for `alg` (everything but the key). */
type Params = [digest: string | null, options: Omit<SignKeyObjectInput, 'key'>];

/**
 * ECDSA signatures are the JWS form, R‖S (RFC 7518 §3.4); RSASSA-PSS uses MGF1 with the same
 * hash and a salt as long as the hash (§3.5).
 */
function paramsOf(alg: JwsAlg): Params {
  if (alg === 'EdDSA') return [null, {}];
  const digest = DIGESTS[alg.slice(2) as keyof typeof DIGESTS];
  if (alg.startsWith('ES')) return [digest, { dsaEncoding: 'ieee-p1363' }];
  if (alg.startsWith('PS')) return [digest, { padding: constants.RSA_PKCS1_PSS_PADDING, saltLength: DIGEST_BYTES[digest] }];
  return [digest, { padding: constants.RSA_PKCS1_PADDING }];
}

/** Each algorithm's, computed once (the worker gets the same table when it starts). */
const PARAMS = Object.fromEntries(ALGS.map((alg) => [alg, paramsOf(alg)])) as Record<JwsAlg, Params>;

/** A check of `signature` over `input`: resolves whether it verifies. */
interface Check {
  alg: JwsAlg;
  input: Buffer;
  signature: Buffer;
  key: KeyObject;
  resolve(valid: boolean): void;
  reject(err: Error): void;
}

/** A signature over `input` (the ASCII `header.payload`): resolves its base64url. */
interface Signing {
  alg: JwsAlg;
  input: string;
  signature?: undefined;
  key: KeyObject;
  resolve(signature: string): void;
  reject(err: Error): void;
}

type Job = Check | Signing;

/** The job on the thread pool (node:crypto's callback form). */
function onThreadPool(job: Job): void {
  const [digest, options] = PARAMS[job.alg];
  if (job.signature === undefined) {
    const { resolve, reject } = job;
    sign(digest, Buffer.from(job.input), { ...options, key: job.key }, (err, signature) => (err ? reject(err) : resolve(signature.toString('base64url'))));
  } else {
    const { resolve, reject } = job;
    verify(digest, job.input, { ...options, key: job.key }, job.signature, (err, valid) => (err ? reject(err) : resolve(valid)));
  }
}

/**
 * The worker, given PARAMS as its workerData: each message a batch, `keys` (each KeyObject once:
 * they cross threads by handle, and a batch of signatures shares one) and `jobs`, each [alg,
 * input, key's index, signature]; a job without a signature is a signing. One answer per job,
 * in order: for a check 1 valid, 2 invalid, for a signing its base64url, and 0 when the key
 * cannot be used.
 */
const WORKER_SOURCE = `'use strict';
const { parentPort, workerData: params } = require('node:worker_threads');
const { sign, verify } = require('node:crypto');
parentPort.on('message', ({ keys, jobs }) => {
  for (let i = 0; i < jobs.length; i++) {
    const [alg, input, keyIndex, signature] = jobs[i];
    const [digest, options] = params[alg];
    const key = keys[keyIndex];
    let result;
    try {
      result = signature === undefined
        ? sign(digest, Buffer.from(input), { ...options, key }).toString('base64url')
        : verify(digest, input, { ...options, key }, signature) ? 1 : 2;
    } catch {
      result = 0;
    }
    parentPort.postMessage(result);
  }
});
`;

/**
 * The worker holds nothing between batches: a small heap keeps its resident memory small. After
 * 40,000 checks the process had grown 33 MB with the defaults, 17 MB with these (a job per
 * check on the thread pool: 3 MB).
 */
const WORKER_LIMITS = { maxYoungGenerationSizeMb: 1, maxOldGenerationSizeMb: 16, codeRangeSizeMb: 8, stackSizeMb: 1 };

/** Jobs per message to the worker. */
const MAX_BATCH = 256;

class JwsWorker {
  private worker: Worker | undefined;
  /** Jobs asked for during this turn of the loop, sent together at its end. */
  private queued: Job[] = [];
  /** Batches sent, each job answered in order: `answered` of the first are. */
  private sent: Job[][] = [];
  private answered = 0;

  run(job: Job): void {
    this.queued.push(job);
    if (this.queued.length === 1) setImmediate(() => this.send());
  }

  private send(): void {
    // At most MAX_BATCH jobs a message (a proof is at most 8 KiB): the worker's heap stays small.
    const batch = this.queued.splice(0, MAX_BATCH);
    if (this.queued.length > 0) setImmediate(() => this.send());
    const worker = this.worker ?? this.start();
    if (worker === undefined) {
      for (const job of batch) onThreadPool(job);
      return;
    }
    // Held only while it owes answers: an idle worker keeps no process alive.
    if (this.sent.length === 0) worker.ref();
    this.sent.push(batch);
    const keys = new Map<KeyObject, number>();
    const jobs = batch.map((job) => {
      let keyIndex = keys.get(job.key);
      if (keyIndex === undefined) keys.set(job.key, (keyIndex = keys.size));
      return [job.alg, job.input, keyIndex, job.signature];
    });
    worker.postMessage({ keys: [...keys.keys()], jobs });
  }

  private start(): Worker | undefined {
    let worker: Worker;
    try {
      worker = new Worker(WORKER_SOURCE, { eval: true, name: 'orgauth-jws', resourceLimits: WORKER_LIMITS, workerData: PARAMS });
    } catch {
      return undefined;
    }
    worker.unref();
    worker.on('message', (result: string | number) => {
      const batch = this.sent[0]!;
      const job = batch[this.answered++]!;
      if (this.answered === batch.length) {
        this.sent.shift();
        this.answered = 0;
        if (this.sent.length === 0) worker.unref();
      }
      if (result === 0) job.reject(new Error(`the key cannot ${job.signature === undefined ? 'sign' : 'verify'} with this algorithm`));
      else if (job.signature === undefined) job.resolve(result as string);
      else job.resolve(result === 1);
    });
    const failed = () => {
      if (this.worker !== worker) return;
      this.worker = undefined;
      const owed = this.sent.flat().slice(this.answered);
      this.sent = [];
      this.answered = 0;
      for (const job of owed) onThreadPool(job);
    };
    worker.on('error', failed);
    worker.on('exit', failed);
    this.worker = worker;
    return worker;
  }
}

const jwsWorker = new JwsWorker();

/**
 * Whether `signature` over `signingInput` (the ASCII of `header.payload`) verifies with `key`
 * under `alg`. Rejects only when node:crypto cannot use the key at all; a wrong signature
 * resolves to false.
 */
export function verifyJwsSignature(alg: JwsAlg, signingInput: Buffer, signature: Buffer, key: KeyObject): Promise<boolean> {
  return new Promise<boolean>((resolve, reject) => jwsWorker.run({ alg, input: signingInput, signature, key, resolve, reject }));
}

/** The base64url signature of `signingInput` (the ASCII of `header.payload`) by the private `key` under `alg`. */
export function signJwsInput(alg: JwsAlg, signingInput: string, key: KeyObject): Promise<string> {
  return new Promise<string>((resolve, reject) => jwsWorker.run({ alg, input: signingInput, key, resolve, reject }));
}
