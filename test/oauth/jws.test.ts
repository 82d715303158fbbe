/**
 * src/oauth/helpers/jws.ts: the signature checks of client-signed JWTs and the signatures of the
 * tokens we issue, run on a worker in batches: every algorithm, a wrong signature false, a key
 * that cannot verify (or sign) refused, and each of many jobs sent at once answered with its own
 * result.
 */
import { generateKeyPairSync, type KeyObject, sign, verify } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { type JwsAlg, signJwsInput, verifyJwsSignature } from '../../src/oauth/helpers/jws.js';

const KEYS = {
  ec256: generateKeyPairSync('ec', { namedCurve: 'P-256' }),
  ec384: generateKeyPairSync('ec', { namedCurve: 'P-384' }),
  ec521: generateKeyPairSync('ec', { namedCurve: 'P-521' }),
  rsa: generateKeyPairSync('rsa', { modulusLength: 2048 }),
  ed: generateKeyPairSync('ed25519'),
};

/** A signature as a JWS signer makes it (RFC 7518 §3.3–3.5, RFC 8037 §3.1). */
function signed(alg: JwsAlg, input: Buffer, key: KeyObject): Buffer {
  if (alg === 'EdDSA') return sign(null, input, key);
  const digest = `sha${alg.slice(2)}`;
  if (alg.startsWith('ES')) return sign(digest, input, { key, dsaEncoding: 'ieee-p1363' });
  if (alg.startsWith('PS')) return sign(digest, input, { key, padding: 6, saltLength: Number(alg.slice(2)) / 8 });
  return sign(digest, input, key);
}

const CASES: [JwsAlg, keyof typeof KEYS][] = [
  ['ES256', 'ec256'], ['ES384', 'ec384'], ['ES512', 'ec521'], ['PS256', 'rsa'], ['PS384', 'rsa'], ['PS512', 'rsa'], ['RS256', 'rsa'], ['RS384', 'rsa'], ['RS512', 'rsa'], ['EdDSA', 'ed'],
];

describe('JWS signature checks', () => {
  it.each(CASES)('%s: a signature verifies, a changed one does not', async (alg, keys) => {
    const input = Buffer.from(`eyJhbGciOiJ${alg}.eyJqdGkiOiIxIn0`);
    const { privateKey, publicKey } = KEYS[keys];
    const signature = signed(alg, input, privateKey);
    expect(await verifyJwsSignature(alg, input, signature, publicKey)).toBe(true);
    const changed = Buffer.from(signature);
    changed[changed.length - 1]! ^= 1;
    expect(await verifyJwsSignature(alg, input, changed, publicKey)).toBe(false);
    expect(await verifyJwsSignature(alg, Buffer.concat([input, Buffer.from('x')]), signature, publicKey)).toBe(false);
  });

  it('never accepts with a key of another type than the algorithm’s, and goes on answering after', async () => {
    const input = Buffer.from('a.b');
    for (const [alg, key] of [['RS256', KEYS.ec256.publicKey], ['ES256', KEYS.rsa.publicKey], ['EdDSA', KEYS.ec256.publicKey], ['ES384', KEYS.ed.publicKey]] as const) {
      expect(await verifyJwsSignature(alg, input, signed('ES256', input, KEYS.ec256.privateKey), key).catch(() => false)).toBe(false);
    }
    // And goes on answering after it.
    expect(await verifyJwsSignature('ES256', input, signed('ES256', input, KEYS.ec256.privateKey), KEYS.ec256.publicKey)).toBe(true);
  });

  it('answers each of 300 checks sent at once, mixed valid and not, across algorithms, with its own result', async () => {
    const checks = Array.from({ length: 300 }, (_, i) => {
      const [alg, keys] = CASES[i % CASES.length]!;
      const input = Buffer.from(`header-${i}.payload-${i}`);
      const good = (i * 7) % 3 !== 0;
      const signature = signed(alg, good ? input : Buffer.from(`other-${i}`), KEYS[keys].privateKey);
      return { alg, input, signature, key: KEYS[keys].publicKey, good };
    });
    const results = await Promise.all(checks.map((c) => verifyJwsSignature(c.alg, c.input, c.signature, c.key)));
    expect(results).toEqual(checks.map((c) => c.good));
  });

  it.each(CASES)('%s: a signature made on the worker verifies with node:crypto, as a JWS verifier checks it', async (alg, keys) => {
    const input = `eyJhbGciOiJ${alg}.eyJqdGkiOiIyIn0`;
    const { privateKey, publicKey } = KEYS[keys];
    const signature = Buffer.from(await signJwsInput(alg, input, privateKey), 'base64url');
    // ECDSA's JWS form is R‖S, twice the curve's size (RFC 7518 §3.4), not DER.
    if (alg.startsWith('ES')) expect(signature.length).toBe({ ES256: 64, ES384: 96, ES512: 132 }[alg as 'ES256']);
    expect(await verifyJwsSignature(alg, Buffer.from(input), signature, publicKey)).toBe(true);
    const digest = alg === 'EdDSA' ? null : `sha${alg.slice(2)}`;
    const options = alg.startsWith('ES') ? { dsaEncoding: 'ieee-p1363' as const } : alg.startsWith('PS') ? { padding: 6, saltLength: Number(alg.slice(2)) / 8 } : {};
    expect(verify(digest, Buffer.from(input), { key: publicKey, ...options }, signature)).toBe(true);
  });

  it('refuses to sign with a public key or a key of another type, and goes on signing after', async () => {
    await expect(signJwsInput('ES256', 'a.b', KEYS.ec256.publicKey)).rejects.toThrow(/cannot sign/);
    await expect(signJwsInput('ES256', 'a.b', KEYS.ed.privateKey)).rejects.toThrow(/cannot sign/);
    const signature = await signJwsInput('ES256', 'a.b', KEYS.ec256.privateKey);
    expect(await verifyJwsSignature('ES256', Buffer.from('a.b'), Buffer.from(signature, 'base64url'), KEYS.ec256.publicKey)).toBe(true);
  });

  it('answers each of 600 signatures and checks asked for at once, interleaved, with its own result', async () => {
    const jobs = Array.from({ length: 600 }, (_, i) => {
      const [alg, keys] = CASES[i % CASES.length]!;
      return { alg, keys, input: `header-${i}.payload-${i}`, sign: i % 2 === 0 };
    });
    const results = await Promise.all(
      jobs.map((j) =>
        j.sign
          ? signJwsInput(j.alg, j.input, KEYS[j.keys].privateKey)
          : verifyJwsSignature(j.alg, Buffer.from(j.input), signed(j.alg, Buffer.from(j.input), KEYS[j.keys].privateKey), KEYS[j.keys].publicKey),
      ),
    );
    for (const [i, j] of jobs.entries()) {
      const result = results[i];
      if (!j.sign) expect(result).toBe(true);
      else expect(await verifyJwsSignature(j.alg, Buffer.from(j.input), Buffer.from(result as string, 'base64url'), KEYS[j.keys].publicKey)).toBe(true);
    }
    // Each signature is over its own input: none verifies over its neighbour's.
    expect(await verifyJwsSignature(jobs[0]!.alg, Buffer.from(jobs[10]!.input), Buffer.from(results[0] as string, 'base64url'), KEYS[jobs[0]!.keys].publicKey)).toBe(false);
  });
});
