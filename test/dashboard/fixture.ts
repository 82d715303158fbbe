/**
 * The dashboard tests' world: four signed-in browsers (an owner, an admin and a member of each
 * organization made with `newOrganization()`, and an outsider with an organization of their own),
 * a fresh organization per test, and small readers for what the pages show once.
 */
import type { FastifyInstance, LightMyRequestResponse } from 'fastify';
import { expect } from 'vitest';
import { addMember, createOrganization } from '../../src/accounts/organizations.js';
import { createUser } from '../../src/accounts/users.js';
import type { DB } from '../../src/db/connect.js';
import { type ApplicationWithSecret, createApplication } from '../../src/oauth/models/applications.js';
import { createGrant } from '../../src/oauth/models/grants.js';
import { ensureSigningKey } from '../../src/oauth/models/signing-keys.js';
import { Browser } from '../accounts/browser.js';
import { buildTestApp, TEST_SECRET_KEY } from '../helpers/app.js';
import { createTestDatabase } from '../helpers/db.js';
import { basic, form } from '../helpers/oauth.js';

export const PASSWORD = 'dashboard-password-1';
export type RoleName = 'owner' | 'admin' | 'member' | 'outsider';

export interface World {
  db: DB;
  app: FastifyInstance;
  users: Record<RoleName, { id: number; email: string }>;
  browsers: Record<RoleName, Browser>;
  close(): Promise<void>;
}

let ip = 0;

/** `env`: configuration on top of the tests' (WEBHOOK_ALLOW_PRIVATE=1 for loopback webhook receivers). */
export async function createWorld(options: { env?: Record<string, string> } = {}): Promise<World> {
  const t = await createTestDatabase();
  const db = t.handle.db;
  await ensureSigningKey(db, { alg: 'ES256', secretKey: TEST_SECRET_KEY });
  const app = await buildTestApp(db, options.env ? { env: options.env } : {});
  const signUp = async (role: RoleName) => {
    const user = await createUser(db, { email: `${role}-${process.pid}@example.com`, password: PASSWORD, name: role });
    return { id: user.id, email: user.email };
  };
  const users: Record<RoleName, { id: number; email: string }> = {
    owner: await signUp('owner'),
    admin: await signUp('admin'),
    member: await signUp('member'),
    outsider: await signUp('outsider'),
  };
  await createOrganization(db, { name: 'Outsider Org', ownerUserId: users.outsider.id });
  const browsers: Record<RoleName, Browser> = {
    owner: new Browser(app, `10.20.0.${++ip}`),
    admin: new Browser(app, `10.20.0.${++ip}`),
    member: new Browser(app, `10.20.0.${++ip}`),
    outsider: new Browser(app, `10.20.0.${++ip}`),
  };
  for (const role of ['owner', 'admin', 'member', 'outsider'] as const) {
    expect((await browsers[role].login(users[role].email, PASSWORD)).statusCode).toBe(303);
  }
  return {
    db,
    app,
    users,
    browsers,
    close: async () => {
      await app.close();
      await t.close();
    },
  };
}

export interface OrgUnderTest {
  id: number;
  name: string;
  privateApp: ApplicationWithSecret;
  publicApp: ApplicationWithSecret;
}

let orgCount = 0;

/** A new organization with the world's owner, admin and member, made current in their browsers. */
export async function newOrganization(w: World, options: { select?: boolean } = {}): Promise<OrgUnderTest> {
  const org = await createOrganization(w.db, { name: `Org ${++orgCount}`, ownerUserId: w.users.owner.id });
  await addMember(w.db, { organizationId: org.id, userId: w.users.admin.id, role: 'admin' });
  await addMember(w.db, { organizationId: org.id, userId: w.users.member.id, role: 'member' });
  const privateApp = await createApplication(w.db, { organizationId: org.id, type: 'private', name: 'Backend', scopes: 'contacts.read tasks.read' });
  const publicApp = await createApplication(w.db, {
    organizationId: org.id,
    type: 'public',
    name: 'Web',
    redirectUris: ['https://client.example.com/cb'],
    scopes: 'contacts.read contacts.write tasks.read',
  });
  if (options.select !== false) for (const role of ['owner', 'admin', 'member'] as const) await selectOrganization(w.browsers[role], org.id);
  return { id: org.id, name: org.name, privateApp, publicApp };
}

export async function csrfOf(b: Browser): Promise<string> {
  return b.csrf('/dashboard');
}

export async function selectOrganization(b: Browser, organizationId: number): Promise<LightMyRequestResponse> {
  return b.post('/dashboard/organization', { csrf_token: await csrfOf(b), organization_id: String(organizationId) });
}

/** Posts a dashboard form with the browser's own CSRF token. */
export async function submit(b: Browser, url: string, fields: Record<string, string | string[]> = {}): Promise<LightMyRequestResponse> {
  return b.post(url, { csrf_token: await csrfOf(b), ...fields });
}

export function secretIn(html: string): string | undefined {
  return /name="client_secret" value="([^"]+)"/.exec(html)?.[1];
}

export function accessTokenIn(html: string): string | undefined {
  return /name="access_token"[^>]*>([^<]+)<\/textarea>/.exec(html)?.[1];
}

export function clientCredentials(app: FastifyInstance, organizationId: number, clientId: string, secret: string) {
  return app.inject({
    method: 'POST',
    url: '/oauth/token',
    headers: { authorization: basic(clientId, secret), 'content-type': 'application/x-www-form-urlencoded' },
    payload: form({ grant_type: 'client_credentials', organization_id: String(organizationId) }),
  });
}

export function listContacts(app: FastifyInstance, organizationId: number, token: string) {
  return app.inject({ method: 'GET', url: `/api/v1/${organizationId}/contacts`, headers: { authorization: `Bearer ${token}`, accept: 'application/json' } });
}

/** A user's grant (as the authorization code flow would create it), for connected-apps tests. */
export async function userGrant(w: World, org: OrgUnderTest, userId: number, scopes: string[]): Promise<number> {
  const application = await w.db.selectFrom('applications').select('id').where('client_id', '=', org.publicApp.client_id).executeTakeFirstOrThrow();
  return (await createGrant(w.db, { organizationId: org.id, applicationId: application.id, userId, scopes }))!.id;
}

export function grantRow(w: World, id: number) {
  return w.db.selectFrom('grants').select(['revoked_at', 'revoked_reason']).where('id', '=', id).executeTakeFirstOrThrow();
}

