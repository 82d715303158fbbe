/**
 * src/oauth/helpers/jws.ts: the signature checks of client-signed JWTs, run on a worker in
 * batches: every algorithm, a wrong signature false, a key that cannot verify refused, and each
 * of many checks sent at once answered with its own result.
 */
import { generateKeyPairSync, type KeyObject, sign } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { type JwsAlg, verifyJwsSignature } from '../../src/oauth/helpers/jws.js';

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
});
