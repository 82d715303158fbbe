import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { verifyPassword } from '../src/accounts/passwords.js';
import { formatDemoBanner, isDatabaseEmpty, seedDemo } from '../src/demo.js';
import { ConflictError } from '../src/errors.js';
import { KNOWN_SCOPES } from '../src/oauth/helpers/scopes.js';
import { secretMatches } from '../src/lib/crypto.js';
import { BACKEND, createTestDatabase } from './helpers/db.js';

let t: Awaited<ReturnType<typeof createTestDatabase>>;
beforeAll(async () => {
  t = await createTestDatabase();
});
afterAll(() => t.close());

describe(`the demo seed on ${BACKEND}`, () => {
  it('fills an empty database with a user, their organization and two applications whose secrets work', async () => {
    const db = t.handle.db;
    expect(await isDatabaseEmpty(db)).toBe(true);
    const seed = await seedDemo(db);
    expect(await isDatabaseEmpty(db)).toBe(false);

    const user = await db.selectFrom('users').selectAll().where('id', '=', seed.user.id).executeTakeFirstOrThrow();
    expect(await verifyPassword(user.password_hash, seed.user.password)).toBe(true);
    expect(seed.user.password.length).toBeGreaterThanOrEqual(16);

    const membership = await db.selectFrom('memberships').selectAll().where('user_id', '=', seed.user.id).execute();
    expect(membership).toEqual([expect.objectContaining({ organization_id: seed.organization.id, role: 'owner' })]);

    const apps = await db.selectFrom('applications').selectAll().where('organization_id', '=', seed.organization.id).orderBy('id').execute();
    expect(apps.map((a) => [a.type, a.redirect_uris, a.client_id, a.scopes])).toEqual([
      ['public', ['http://localhost:8080/callback'], seed.public_application.client_id, ['contacts.read', 'contacts.write', 'tasks.read', 'tasks.write']],
      // The integration may also use the management API, as the banner shows.
      ['private', [], seed.private_application.client_id, [...KNOWN_SCOPES]],
    ]);
    expect(secretMatches(seed.public_application.client_secret, apps[0]!.client_secret_hash)).toBe(true);
    expect(secretMatches(seed.private_application.client_secret, apps[1]!.client_secret_hash)).toBe(true);
  });

  it('is refused a second time without touching anything', async () => {
    const before = await t.handle.db.selectFrom('applications').select('id').execute();
    await expect(seedDemo(t.handle.db)).rejects.toBeInstanceOf(ConflictError);
    expect(await t.handle.db.selectFrom('applications').select('id').execute()).toEqual(before);
    expect(await t.handle.db.selectFrom('organizations').select('id').execute()).toHaveLength(1);
  });
});

describe('the demo banner', () => {
  it('shows the login, both applications and a ready-to-paste client_credentials curl', () => {
    const app = (type: 'public' | 'private', id: string) => ({
      client_id: id, client_secret: `${id}-secret`, type, organization_id: 7, name: `${type} app`,
      redirect_uris: type === 'public' ? ['http://localhost:8080/callback'] : [], post_logout_redirect_uris: [], scopes: ['contacts.read', 'tasks.read', 'applications.read'],
    });
    const banner = formatDemoBanner(
      {
        user: { id: 1, email: 'demo@orgauth.local', name: 'Demo User', password: 'pw-1234567890' },
        organization: { id: 7, name: 'Demo Organization' },
        public_application: app('public', 'pub'),
        private_application: app('private', 'priv'),
      },
      'http://localhost:3000',
    );
    expect(banner).toContain('email:    demo@orgauth.local');
    expect(banner).toContain('password: pw-1234567890');
    expect(banner).toContain('client_secret: pub-secret');
    expect(banner).toContain(
      [
        "   curl -s -u 'priv:priv-secret' \\",
        '     -d grant_type=client_credentials -d organization_id=7 \\',
        "     --data-urlencode 'scope=contacts.read tasks.read' \\",
        '     http://localhost:3000/oauth/token',
      ].join('\n'),
    );
    expect(banner).toContain(
      [
        "   TOKEN=$(curl -s -u 'priv:priv-secret' \\",
        '     -d grant_type=client_credentials -d organization_id=7 -d scope=applications.read \\',
        `     http://localhost:3000/oauth/token | sed -E 's/.*"access_token":"([^"]+)".*/\\1/')`,
        '   curl -s -H "Authorization: Bearer $TOKEN" http://localhost:3000/api/v1/7/applications',
      ].join('\n'),
    );
  });
});
