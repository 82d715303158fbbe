/**
 * One JWS signature check (RFC 7515 §5.2 step 8) for the JWTs clients sign: DPoP proofs
 * (helpers/dpop.ts) and client assertions (helpers/client-assertion.ts). The caller has checked
 * the header (the algorithm is one it allows, the key fits it); this only checks the bytes.
 *
 * Where the check runs: on one thread of its own (a worker), off the event loop, the checks that
 * arrive during one turn of the loop sent to it together and answered together. Measured on the
 * bench's API row (DPoP against bearer, a 2-core machine shared with PostgreSQL and the load):
 * - on the event loop, node:crypto's synchronous verify (ES256 ~48 µs): 0.754 of bearer;
 * - node:crypto's callback form, one libuv thread-pool job per check: 0.783;
 * - this worker: 0.813–0.821 (medians of six rounds each, interleaved in one run).
 * The verification costs the same CPU wherever it runs; a job per check costs a wake-up of a
 * pool thread and of the loop each, which the loop pays in time it could serve requests with,
 * where a batch pays them once. node:crypto still does the arithmetic (three times faster than
 * jose through WebCrypto here). Should the worker fail, the checks it held, and the next ones
 * until a new worker starts, go to the thread pool.
 */
import { constants, type KeyObject, verify, type VerifyKeyObjectInput } from 'node:crypto';
import { Worker } from 'node:worker_threads';

/** The asymmetric JWS algorithms (RFC 7518 §3.1, RFC 8037 §3.1) a client may sign with. */
export type JwsAlg = 'ES256' | 'ES384' | 'ES512' | 'PS256' | 'PS384' | 'PS512' | 'RS256' | 'RS384' | 'RS512' | 'EdDSA';

const DIGESTS = { '256': 'sha256', '384': 'sha384', '512': 'sha512' } as const;
const DIGEST_BYTES = { sha256: 32, sha384: 48, sha512: 64 } as const;

/** node:crypto's digest and options for `alg` (everything but the key). */
type Params = [digest: string | null, options: Omit<VerifyKeyObjectInput, 'key'>];

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

interface Job {
  params: Params;
  input: Buffer;
  signature: Buffer;
  key: KeyObject;
  resolve(valid: boolean): void;
  reject(err: Error): void;
}

/** The check on the thread pool (node:crypto's callback form). */
function onThreadPool(job: Job): void {
  const [digest, options] = job.params;
  verify(digest, job.input, { ...options, key: job.key }, job.signature, (err, valid) => (err ? job.reject(err) : job.resolve(valid)));
}

/**
 * The worker: each message a batch of [digest, options, input, key, signature], each answer one
 * byte per check (1 valid, 2 invalid, 0 the key unusable). KeyObjects cross threads by handle.
 */
const WORKER_SOURCE = `'use strict';
const { parentPort } = require('node:worker_threads');
const { verify } = require('node:crypto');
parentPort.on('message', (batch) => {
  const results = new Uint8Array(batch.length);
  for (let i = 0; i < batch.length; i++) {
    const [digest, options, input, key, signature] = batch[i];
    try {
      results[i] = verify(digest, input, { ...options, key }, signature) ? 1 : 2;
    } catch {
      results[i] = 0;
    }
  }
  parentPort.postMessage(results);
});
`;

/**
 * The worker holds nothing between batches: a small heap keeps its resident memory small. After
 * 40,000 checks the process had grown 33 MB with the defaults, 17 MB with these (a job per
 * check on the thread pool: 3 MB).
 */
const WORKER_LIMITS = { maxYoungGenerationSizeMb: 1, maxOldGenerationSizeMb: 16, codeRangeSizeMb: 8, stackSizeMb: 1 };

/** Checks per message to the worker. */
const MAX_BATCH = 256;

class Verifier {
  private worker: Worker | undefined;
  /** Checks asked for during this turn of the loop, sent together at its end. */
  private queued: Job[] = [];
  /** Batches sent, answered in order. */
  private sent: Job[][] = [];

  check(job: Job): void {
    this.queued.push(job);
    if (this.queued.length === 1) setImmediate(() => this.send());
  }

  private send(): void {
    // At most MAX_BATCH checks a message (a proof is at most 8 KiB): the worker's heap stays small.
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
    worker.postMessage(batch.map((job) => [...job.params, job.input, job.key, job.signature]));
  }

  private start(): Worker | undefined {
    let worker: Worker;
    try {
      worker = new Worker(WORKER_SOURCE, { eval: true, name: 'orgauth-jws', resourceLimits: WORKER_LIMITS });
    } catch {
      return undefined;
    }
    worker.unref();
    worker.on('message', (results: Uint8Array) => {
      const batch = this.sent.shift() ?? [];
      if (this.sent.length === 0) worker.unref();
      for (const [i, job] of batch.entries()) {
        if (results[i] === 0) job.reject(new Error('the key cannot verify this signature'));
        else job.resolve(results[i] === 1);
      }
    });
    const failed = () => {
      if (this.worker !== worker) return;
      this.worker = undefined;
      const owed = this.sent.flat();
      this.sent = [];
      for (const job of owed) onThreadPool(job);
    };
    worker.on('error', failed);
    worker.on('exit', failed);
    this.worker = worker;
    return worker;
  }
}

const verifier = new Verifier();

/**
 * Whether `signature` over `signingInput` (the ASCII of `header.payload`) verifies with `key`
 * under `alg`. Rejects only when node:crypto cannot use the key at all; a wrong signature
 * resolves to false.
 */
export function verifyJwsSignature(alg: JwsAlg, signingInput: Buffer, signature: Buffer, key: KeyObject): Promise<boolean> {
  return new Promise<boolean>((resolve, reject) => verifier.check({ params: paramsOf(alg), input: signingInput, signature, key, resolve, reject }));
}
