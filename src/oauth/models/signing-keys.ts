/**
 * Signing keys for access tokens and ID tokens, one active key per algorithm in use. Kept in the database so every instance signs and verifies with
 * the same keys; the private half is stored as a compact JWE (dir + A256GCM) under a key derived
 * from SECRET_KEY, so a database dump alone cannot mint tokens.
 */
import {
  calculateJwkThumbprint,
  CompactEncrypt,
  compactDecrypt,
  exportJWK,
  generateKeyPair,
  importJWK,
  type CryptoKey,
  type JWK,
} from 'jose';
import { sql } from 'kysely';
import { ConfigError, type SigningAlg } from '../../config.js';
import type { DB } from '../../db/connect.js';
import { isUniqueViolation } from '../../db/errors.js';
import { ID_TOKEN_ALGS, type SigningKey } from '../../db/schema.js';
import { deriveKey } from '../../lib/crypto.js';

const ENCRYPTION_PURPOSE = 'signing-key-encryption';

async function createKeyRow(alg: SigningAlg, secretKey: string) {
  const { publicKey, privateKey } = await generateKeyPair(alg, { extractable: true, ...(alg === 'RS256' ? { modulusLength: 2048 } : {}) });
  const publicJwk = await exportJWK(publicKey);
  // RFC 7638 thumbprint: a kid that names the key itself, the same on every instance.
  const kid = await calculateJwkThumbprint(publicJwk);
  const privateJwk = await exportJWK(privateKey);
  const privateJwkEncrypted = await new CompactEncrypt(new TextEncoder().encode(JSON.stringify(privateJwk)))
    .setProtectedHeader({ alg: 'dir', enc: 'A256GCM', kid })
    .encrypt(deriveKey(secretKey, ENCRYPTION_PURPOSE));
  return {
    kid,
    alg,
    public_jwk: JSON.stringify({ ...publicJwk, kid, alg, use: 'sig' } satisfies JWK),
    private_jwk_encrypted: privateJwkEncrypted,
  };
}

/**
 * Makes a new key the signing key of its algorithm and retires that algorithm's current one.
 * Retired keys stay available for verification (and in the JWKS) until every token they signed
 * has expired.
 */
export async function rotateSigningKey(db: DB, options: { alg: SigningAlg; secretKey: string }): Promise<{ kid: string; alg: SigningAlg }> {
  const row = await createKeyRow(options.alg, options.secretKey);
  // Two instances rotating at once: the one-active-key-per-algorithm index refuses the second insert; retry.
  for (let attempt = 0; ; attempt++) {
    try {
      await db.transaction().execute(async (trx) => {
        const retired = await trx
          .updateTable('signing_keys')
          .set({ retired_at: new Date() })
          .where('retired_at', 'is', null)
          .where('alg', '=', options.alg)
          .returning('kid')
          .execute();
        await trx.insertInto('signing_keys').values(row).execute();
        await auditKeyChange(trx, { kid: row.kid, alg: row.alg, retired: retired.map((k) => k.kid) });
      });
      return { kid: row.kid, alg: options.alg };
    } catch (err) {
      if (!isUniqueViolation(err, ACTIVE_KEY_INDEX) || attempt >= 2) throw err;
    }
  }
}

/** Keys sign every organization's tokens, so a new or retired key goes into every organization's log. */
async function auditKeyChange(trx: DB, change: { kid: string | null; alg: string; retired: readonly string[] }): Promise<void> {
  await trx
    .insertInto('audit_events')
    .columns(['organization_id', 'action', 'details'])
    .expression((eb) =>
      eb
        .selectFrom('organizations')
        .select([
          'id',
          sql<string>`${change.kid === null ? 'signing_key.retired' : 'signing_key.rotated'}::text`.as('action'),
          sql<string>`jsonb_strip_nulls(jsonb_build_object('kid', ${change.kid}::text, 'alg', ${change.alg}::text, 'retired', ${change.retired.join(' ')}::text))`.as('details'),
        ]),
    )
    .execute();
}

const ACTIVE_KEY_INDEX = 'signing_keys_one_active_key_per_alg';

/** The active key of `alg`: each algorithm in use has one (SIGNING_ALG's signs access tokens, ID tokens use their application's). */
export async function getActiveSigningKey(db: DB, alg: SigningAlg): Promise<SigningKey | undefined> {
  return db.selectFrom('signing_keys').selectAll().where('retired_at', 'is', null).where('alg', '=', alg).executeTakeFirst();
}

/** A SECRET_KEY that cannot decrypt the keys would let the server start and then fail every token. */
async function assertDecryptable(key: SigningKey, secretKey: string): Promise<void> {
  try {
    await importPrivateKey(key, secretKey);
  } catch (err) {
    throw new ConfigError(
      [`SECRET_KEY: cannot decrypt signing key ${key.kid} stored in the database; it is not the key the database was set up with`],
      { cause: err },
    );
  }
}

/**
 * The algorithms with an active key: SIGNING_ALG (access tokens) and the ID token algorithms an
 * application may ask for (RS256, which OpenID Connect Discovery requires, and ES256).
 */
export function activeAlgorithms(signingAlg: SigningAlg): SigningAlg[] {
  return [...new Set<SigningAlg>([signingAlg, ...ID_TOKEN_ALGS])];
}

/**
 * Make sure each algorithm in use (activeAlgorithms) has an active key, creating the missing
 * ones. At the server's start (`retireUnused`), also retire the active key of an algorithm no
 * longer in use (SIGNING_ALG changed: its tokens still verify until they expire); never from a
 * CLI beside it, whose environment may not be the server's. Returns the kid of `alg`'s key.
 */
export async function ensureSigningKey(db: DB, options: { alg: SigningAlg; secretKey: string; retireUnused?: boolean }): Promise<string> {
  const wanted = activeAlgorithms(options.alg);
  let kid: string | undefined;
  for (const alg of wanted) {
    const ensured = await ensureActiveKey(db, alg, options.secretKey);
    if (alg === options.alg) kid = ensured;
  }
  if (!options.retireUnused) return kid!;
  await db.transaction().execute(async (trx) => {
    const retired = await trx.updateTable('signing_keys').set({ retired_at: new Date() }).where('retired_at', 'is', null).where('alg', 'not in', wanted).returning(['kid', 'alg']).execute();
    for (const key of retired) await auditKeyChange(trx, { kid: null, alg: key.alg, retired: [key.kid] });
  });
  return kid!;
}

/** The kid of `alg`'s active key, created when there is none (concurrent creations settle on one). */
export async function ensureActiveKey(db: DB, alg: SigningAlg, secretKey: string): Promise<string> {
  for (let attempt = 0; attempt < 3; attempt++) {
    const active = await getActiveSigningKey(db, alg);
    if (active) {
      await assertDecryptable(active, secretKey);
      return active.kid;
    }
    const row = await createKeyRow(alg, secretKey);
    try {
      await db.insertInto('signing_keys').values(row).execute();
      return row.kid;
    } catch (err) {
      // Another instance created it at the same moment: use theirs.
      if (!isUniqueViolation(err, ACTIVE_KEY_INDEX)) throw err;
    }
  }
  throw new Error(`could not establish an active ${alg} signing key`);
}

function isJwk(value: unknown): value is JWK {
  return typeof value === 'object' && value !== null && 'kty' in value && typeof value.kty === 'string';
}

/** Decrypts a key's private half. Fails when SECRET_KEY is not the one it was encrypted with. */
export async function importPrivateKey(key: Pick<SigningKey, 'alg' | 'private_jwk_encrypted'>, secretKey: string): Promise<CryptoKey> {
  const { plaintext } = await compactDecrypt(key.private_jwk_encrypted, deriveKey(secretKey, ENCRYPTION_PURPOSE), {
    keyManagementAlgorithms: ['dir'],
    contentEncryptionAlgorithms: ['A256GCM'],
  });
  const jwk: unknown = JSON.parse(new TextDecoder().decode(plaintext));
  if (!isJwk(jwk)) throw new Error('a signing key decrypted to something other than a JWK');
  const imported = await importJWK(jwk, key.alg);
  if (imported instanceof Uint8Array) throw new Error('a signing key decrypted to a symmetric key');
  return imported;
}

export interface SigningKeyStatus {
  kid: string;
  alg: SigningAlg;
  /** active: signs new tokens; retired: verifies tokens it signed until they expire (in the JWKS); expired: none of its tokens is left. */
  status: 'active' | 'retired' | 'expired';
  created_at: Date;
  retired_at: Date | null;
}

/** Every signing key, newest first, with what it is still good for; never the private half. */
export async function listSigningKeys(db: DB, options: { accessTokenTtl: number }): Promise<SigningKeyStatus[]> {
  const rows = await db.selectFrom('signing_keys').select(['kid', 'alg', 'created_at', 'retired_at']).orderBy('created_at', 'desc').orderBy('kid').execute();
  const cutoff = Date.now() - options.accessTokenTtl * 1000;
  return rows.map((k) => ({ ...k, status: k.retired_at === null ? 'active' : k.retired_at.getTime() > cutoff ? 'retired' : 'expired' }));
}
