import { compactVerify, importJWK, CompactSign } from 'jose';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { verifyPassword } from '../../src/accounts/passwords.js';
import { createUser } from '../../src/accounts/users.js';
import { generateSecret, secretMatches, sha256Hex } from '../../src/lib/crypto.js';
import { createApplication, findApplicationByClientId, rotateClientSecret } from '../../src/oauth/models/applications.js';
import { ensureSigningKey, getActiveSigningKey, importPrivateKey, rotateSigningKey } from '../../src/oauth/models/signing-keys.js';
import { BACKEND, createTestDatabase } from '../helpers/db.js';

const SECRET_KEY = 'a-secret-key-of-at-least-32-characters!!';
let t: Awaited<ReturnType<typeof createTestDatabase>>;
let orgId: number;

beforeAll(async () => {
  t = await createTestDatabase();
  orgId = (await t.handle.db.insertInto('organizations').values({ name: 'Acme' }).returning('id').executeTakeFirstOrThrow()).id;
});
afterAll(() => t.close());

describe('random secrets', () => {
  it('carry 256 bits from the CSPRNG, base64url-encoded', () => {
    const secrets = new Set(Array.from({ length: 1000 }, () => generateSecret()));
    expect(secrets.size).toBe(1000);
    for (const s of secrets) expect(s).toMatch(/^[A-Za-z0-9_-]{43}$/);
  });

  it('are compared by their SHA-256 digest', () => {
    const secret = generateSecret();
    const digest = sha256Hex(secret);
    expect(digest).toMatch(/^[0-9a-f]{64}$/);
    expect(secretMatches(secret, digest)).toBe(true);
    expect(secretMatches(`${secret}x`, digest)).toBe(false);
    expect(secretMatches(secret, 'not-hex')).toBe(false);
    expect(secretMatches('', digest)).toBe(false);
    // Every character counts, the last as much as the first; hex compares as the bytes it names.
    const other = (c: string) => (c === '0' ? '1' : '0');
    expect(secretMatches(secret, `${digest.slice(0, -1)}${other(digest.at(-1)!)}`)).toBe(false);
    expect(secretMatches(secret, `${other(digest[0]!)}${digest.slice(1)}`)).toBe(false);
    expect(secretMatches(secret, digest.slice(0, -1))).toBe(false);
    expect(secretMatches(secret, `${digest}0`)).toBe(false);
    expect(secretMatches(secret, digest.toUpperCase())).toBe(true);
    expect(secretMatches(secret, null)).toBe(false);
  });
});

describe(`applications on ${BACKEND}`, () => {
  it('keep only the hash of the client secret', async () => {
    const app = await createApplication(t.handle.db, { organizationId: orgId, type: 'private', name: 'Sync' });
    expect(app.client_secret).toMatch(/^[A-Za-z0-9_-]{43}$/);
    expect(app.client_id).toMatch(/^[0-9a-f]{32}$/);
    const row = await findApplicationByClientId(t.handle.db, app.client_id);
    expect(row?.client_secret_hash).toBe(sha256Hex(app.client_secret));
    const dump = JSON.stringify(await t.handle.db.selectFrom('applications').selectAll().execute());
    expect(dump).not.toContain(app.client_secret);
  });

  it('get the data scopes by default, and the scopes asked for otherwise', async () => {
    const all = await createApplication(t.handle.db, { organizationId: orgId, type: 'private', name: 'All' });
    expect(all.scopes).toEqual(['contacts.read', 'contacts.write', 'tasks.read', 'tasks.write']);
    const some = await createApplication(t.handle.db, { organizationId: orgId, type: 'private', name: 'Some', scopes: 'tasks.read  contacts.read tasks.read' });
    expect(some.scopes).toEqual(['contacts.read', 'tasks.read']);
  });

  it('rotate the secret so the old one stops matching at once', async () => {
    const app = await createApplication(t.handle.db, { organizationId: orgId, type: 'private', name: 'Rotating' });
    const rotated = await rotateClientSecret(t.handle.db, app);
    expect(rotated.client_id).toBe(app.client_id);
    expect(rotated.client_secret).not.toBe(app.client_secret);
    const row = await findApplicationByClientId(t.handle.db, app.client_id);
    expect(secretMatches(rotated.client_secret, row!.client_secret_hash)).toBe(true);
    expect(secretMatches(app.client_secret, row!.client_secret_hash)).toBe(false);
    expect(row!.secret_rotated_at).toBeInstanceOf(Date);
    const events = await t.handle.db.selectFrom('audit_events').select(['action', 'details']).where('organization_id', '=', orgId).execute();
    expect(events).toContainEqual({ action: 'application.secret_rotated', details: { client_id: app.client_id } });
  });
});

describe(`passwords on ${BACKEND}`, () => {
  it('are stored as argon2id hashes and verified against them', async () => {
    const user = await createUser(t.handle.db, { email: 'pw@example.com', password: 'correct horse battery' });
    const { password_hash } = await t.handle.db.selectFrom('users').select('password_hash').where('id', '=', user.id).executeTakeFirstOrThrow();
    expect(password_hash).toMatch(/^\$argon2id\$v=19\$/);
    expect(await verifyPassword(password_hash, 'correct horse battery')).toBe(true);
    expect(await verifyPassword(password_hash, 'wrong horse battery')).toBe(false);
  });
});

describe(`signing keys on ${BACKEND}`, () => {
  it('are created once, encrypted at rest, and usable only with SECRET_KEY', async () => {
    const kid = await ensureSigningKey(t.handle.db, { alg: 'ES256', secretKey: SECRET_KEY });
    expect(await ensureSigningKey(t.handle.db, { alg: 'ES256', secretKey: SECRET_KEY })).toBe(kid);
    const key = await getActiveSigningKey(t.handle.db, 'ES256');
    expect(key).toMatchObject({ kid, alg: 'ES256', retired_at: null });
    // Beside it an RS256 key for the ID tokens that ask for it (OpenID Connect Discovery requires RS256).
    const rsa = await getActiveSigningKey(t.handle.db, 'RS256');
    expect(rsa!.public_jwk).toMatchObject({ kty: 'RSA', alg: 'RS256', use: 'sig' });
    expect(rsa!.public_jwk).not.toHaveProperty('d');
    expect(key!.public_jwk).toMatchObject({ kty: 'EC', crv: 'P-256', kid, alg: 'ES256', use: 'sig' });
    expect(key!.public_jwk).not.toHaveProperty('d');
    // The stored private half is a JWE, not a JWK with its "d".
    expect(key!.private_jwk_encrypted.split('.')).toHaveLength(5);
    expect(key!.private_jwk_encrypted).not.toContain('"d"');

    const privateKey = await importPrivateKey(key!, SECRET_KEY);
    const jws = await new CompactSign(new TextEncoder().encode('hello')).setProtectedHeader({ alg: 'ES256', kid }).sign(privateKey);
    const verified = await compactVerify(jws, await importJWK(key!.public_jwk, 'ES256'));
    expect(new TextDecoder().decode(verified.payload)).toBe('hello');

    await expect(importPrivateKey(key!, 'another-secret-key-of-32-characters!!')).rejects.toThrow();
  });

  it('refuse to start with a SECRET_KEY that cannot decrypt them', async () => {
    await expect(ensureSigningKey(t.handle.db, { alg: 'ES256', secretKey: 'a-different-secret-key-of-32-chars!!' })).rejects.toThrow(
      /^SECRET_KEY: cannot decrypt signing key/,
    );
  });

  it('rotate: the new key becomes the active key of its algorithm and the old one is retired, not deleted', async () => {
    const before = await getActiveSigningKey(t.handle.db, 'ES256');
    const rsa = await getActiveSigningKey(t.handle.db, 'RS256');
    const rotated = await rotateSigningKey(t.handle.db, { alg: 'ES256', secretKey: SECRET_KEY });
    expect(rotated.alg).toBe('ES256');
    const keys = await t.handle.db.selectFrom('signing_keys').select(['kid', 'alg', 'retired_at']).execute();
    expect(keys.find((k) => k.kid === before!.kid)?.retired_at).toBeInstanceOf(Date);
    // The other algorithm's key is not touched.
    expect(keys.filter((k) => k.retired_at === null).sort((a, b) => a.alg.localeCompare(b.alg))).toEqual([
      { kid: rotated.kid, alg: 'ES256', retired_at: null },
      { kid: rsa!.kid, alg: 'RS256', retired_at: null },
    ]);
    const logged = await t.handle.db.selectFrom('audit_events').select('details').where('organization_id', '=', orgId).where('action', '=', 'signing_key.rotated').execute();
    expect(logged).toEqual([{ details: { kid: rotated.kid, alg: 'ES256', retired: before!.kid } }]);
  });

  it('follow SIGNING_ALG: a changed algorithm gets its key at start-up, and one no longer used is retired', async () => {
    const kid = await ensureSigningKey(t.handle.db, { alg: 'EdDSA', secretKey: SECRET_KEY });
    const active = await getActiveSigningKey(t.handle.db, 'EdDSA');
    expect(active).toMatchObject({ kid, alg: 'EdDSA' });
    expect(active!.public_jwk).toMatchObject({ kty: 'OKP', crv: 'Ed25519' });
    // Back to ES256 in a CLI's environment: nothing is retired (it may not be the server's).
    await ensureSigningKey(t.handle.db, { alg: 'ES256', secretKey: SECRET_KEY });
    expect(await getActiveSigningKey(t.handle.db, 'EdDSA')).toMatchObject({ kid });
    // At the server's start: the EdDSA key is retired (its tokens verify until they expire); RS256 and ES256 stay.
    await ensureSigningKey(t.handle.db, { alg: 'ES256', secretKey: SECRET_KEY, retireUnused: true });
    expect(await getActiveSigningKey(t.handle.db, 'EdDSA')).toBeUndefined();
    const algs = await t.handle.db.selectFrom('signing_keys').select('alg').where('retired_at', 'is', null).orderBy('alg').execute();
    expect(algs.map((k) => k.alg)).toEqual(['ES256', 'RS256']);
    const retired = await t.handle.db.selectFrom('audit_events').select('details').where('organization_id', '=', orgId).where('action', '=', 'signing_key.retired').execute();
    expect(retired).toEqual([{ details: { alg: 'EdDSA', retired: kid } }]);
  });

  it('survive two instances creating the first key at once', async () => {
    const other = await createTestDatabase();
    try {
      const kids = await Promise.all([
        ensureSigningKey(other.handle.db, { alg: 'ES256', secretKey: SECRET_KEY }),
        ensureSigningKey(other.handle.db, { alg: 'ES256', secretKey: SECRET_KEY }),
      ]);
      const active = await other.handle.db.selectFrom('signing_keys').select('kid').where('retired_at', 'is', null).where('alg', '=', 'ES256').execute();
      expect(active).toHaveLength(1);
      expect(await other.handle.db.selectFrom('signing_keys').select('kid').where('retired_at', 'is', null).execute()).toHaveLength(2);
      expect(kids).toEqual([active[0]!.kid, active[0]!.kid]);
    } finally {
      await other.close();
    }
  });
});
