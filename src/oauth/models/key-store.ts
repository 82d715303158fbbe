/**
 * The signing keys as this instance uses them: the active private key for signing, public keys
 * by kid for verification, and the JWKS. Keys come only from our database, never from a URL
 * (RFC 8725 §3.10); an unknown kid triggers at most one reload per second, so a key rotated on
 * another instance is picked up while a flood of made-up kids costs one query a second.
 */
import { KeyObject } from 'node:crypto';
import { type CryptoKey, importJWK, type JWK } from 'jose';
import type { SigningAlg } from '../../config.js';
import type { DB } from '../../db/connect.js';
import type { SigningKey } from '../../db/schema.js';
import { ensureActiveKey, importPrivateKey } from './signing-keys.js';
import { signJwsInput } from '../helpers/jws.js';

const RELOAD_INTERVAL_MS = 1000;
const ACTIVE_CHECK_MS = 500;

export interface SigningKeyMaterial {
  kid: string;
  alg: SigningAlg;
  key: CryptoKey;
  /** The same key for node:crypto, which signs about three times faster than WebCrypto here. */
  keyObject: KeyObject;
  /** The base64url JWS header of access tokens for this key (alg, kid, typ at+jwt, RFC 9068), computed once. */
  header: string;
  /** The base64url JWS header of ID tokens for this key (alg, kid, typ JWT): never taken for an access token. */
  idTokenHeader: string;
}

/**
 * A compact JWS (RFC 7515 §7.1) of `payload` under `header` (one of the key's), signed with
 * node:crypto (jose through WebCrypto costs about 210 µs per ES256 signature here, node:crypto
 * about 65 µs) on the JWS worker thread (helpers/jws.ts): the event loop goes on serving requests
 * meanwhile, and a second core signs.
 */
export async function signJws(signingKey: SigningKeyMaterial, header: string, payload: object): Promise<string> {
  const signingInput = `${header}.${Buffer.from(JSON.stringify(payload)).toString('base64url')}`;
  return `${signingInput}.${await signJwsInput(signingKey.alg, signingInput, signingKey.keyObject)}`;
}

interface VerificationKey {
  alg: SigningAlg;
  key: CryptoKey;
}

export class KeyStore {
  /** The active key of each algorithm, decrypted once (a promise, so concurrent first uses share it). */
  private signing = new Map<SigningAlg, Promise<SigningKeyMaterial>>();
  private signingCheckedAt = 0;
  private checking: Promise<void> | undefined;
  private verification = new Map<string, VerificationKey>();
  private lastReload = 0;
  private reloading: Promise<void> | undefined;

  constructor(
    private readonly db: DB,
    private readonly options: { secretKey: string; accessTokenTtl: number; signingAlg: SigningAlg },
  ) {}

  /**
   * The active key of `alg` (SIGNING_ALG's, for access tokens, when none is named), decrypted
   * once and cached. At most twice a second the active kids are read again (one query for every
   * algorithm), so a key rotated by another instance (or the CLI) is signed with within a second.
   */
  async signingKey(alg: SigningAlg = this.options.signingAlg): Promise<SigningKeyMaterial> {
    if (this.signing.size > 0 && Date.now() - this.signingCheckedAt > ACTIVE_CHECK_MS) {
      this.signingCheckedAt = Date.now();
      this.checking ??= this.checkActive().finally(() => {
        this.checking = undefined;
      });
      await this.checking;
    }
    this.signingCheckedAt ||= Date.now();
    let material = this.signing.get(alg);
    if (!material) {
      material = this.load(alg).catch((err: unknown) => {
        this.signing.delete(alg);
        throw err;
      });
      this.signing.set(alg, material);
    }
    return material;
  }

  /** Drops a cached key that is no longer its algorithm's active one. */
  private async checkActive(): Promise<void> {
    const active = await this.db.selectFrom('signing_keys').select(['kid', 'alg']).where('retired_at', 'is', null).execute();
    for (const [alg, material] of this.signing) {
      const current = await material.catch(() => undefined);
      if (current?.kid !== active.find((k) => k.alg === alg)?.kid && this.signing.get(alg) === material) this.signing.delete(alg);
    }
  }

  private async load(alg: SigningAlg): Promise<SigningKeyMaterial> {
    const active = () => this.db.selectFrom('signing_keys').selectAll().where('retired_at', 'is', null).where('alg', '=', alg).executeTakeFirst();
    // None (an older instance of a rolling deploy retired every key at once): made now, once for all instances.
    let row = await active();
    if (!row) {
      await ensureActiveKey(this.db, alg, this.options.secretKey);
      row = await active();
    }
    if (!row) throw new Error(`no active ${alg} signing key: the server creates one at start, \`orgauth keys rotate\` makes a new one`);
    const key = await importPrivateKey(row, this.options.secretKey);
    const header = (typ: string) => Buffer.from(JSON.stringify({ alg: row.alg, kid: row.kid, typ })).toString('base64url');
    return { kid: row.kid, alg: row.alg, key, keyObject: KeyObject.from(key), header: header('at+jwt'), idTokenHeader: header('JWT') };
  }

  /** The public key for `kid`, or undefined for a kid we never issued (or whose tokens have all expired). */
  async verificationKey(kid: string): Promise<VerificationKey | undefined> {
    const cached = this.verification.get(kid);
    if (cached) return cached;
    if (Date.now() - this.lastReload < RELOAD_INTERVAL_MS) return undefined;
    await this.reload();
    return this.verification.get(kid);
  }

  /** Keys that may still have live tokens: the active one and those retired less than a token lifetime ago. */
  async publishedKeys(): Promise<SigningKey[]> {
    const cutoff = new Date(Date.now() - this.options.accessTokenTtl * 1000);
    return this.db
      .selectFrom('signing_keys')
      .selectAll()
      .where((eb) => eb.or([eb('retired_at', 'is', null), eb('retired_at', '>', cutoff)]))
      .orderBy('created_at', 'desc')
      .execute();
  }

  /** RFC 7517 JWK Set of the published keys. */
  async jwks(): Promise<{ keys: JWK[] }> {
    return { keys: (await this.publishedKeys()).map((k) => k.public_jwk) };
  }

  private reload(): Promise<void> {
    this.reloading ??= (async () => {
      const next = new Map<string, VerificationKey>();
      for (const row of await this.publishedKeys()) {
        const known = this.verification.get(row.kid);
        const key = known?.key ?? (await importJWK(row.public_jwk, row.alg));
        if (key instanceof Uint8Array) throw new Error(`signing key ${row.kid} is symmetric`);
        next.set(row.kid, { alg: row.alg, key });
      }
      this.verification = next;
      this.lastReload = Date.now();
    })().finally(() => {
      this.reloading = undefined;
    });
    return this.reloading;
  }
}
