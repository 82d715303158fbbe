/**
 * The SCIM service end to end (issue 43): an Okta-style and an Entra-style client, each written
 * from its vendor's published SCIM documentation, provision, update, group and deprovision people
 * of a verified domain; a deprovisioned member's access token is refused on the next request and
 * their grants end; reactivation makes them a member again. A directory cannot provision an
 * address outside its organization's verified domains, nor read or change another directory's
 * users; a rotated token is refused at once.
 *
 * Okta: https://developer.okta.com/docs/reference/scim/scim-20/ (filter `userName eq` before a
 * create, `active` and attributes changed by PATCH `replace` without a path, groups PATCHed with
 * `members` add and `members[value eq "…"]` remove).
 * Entra ID: https://learn.microsoft.com/en-us/entra/identity/app-provisioning/use-scim-to-provision-users-and-groups
 * (`Replace`/`Add`/`Remove` capitalised, `active` as the string "False" unless the
 * aadOptscim062020 flag is set, `emails[type eq "work"].value` paths, group members removed with
 * `{"op":"Remove","path":"members","value":[{"value":…}]}`).
 */
import type { FastifyInstance, LightMyRequestResponse } from 'fastify';
import { afterAll, beforeAll, describe, expect, it, onTestFinished, vi } from 'vitest';
import { createUser as createAccount } from '../../src/accounts/users.js';
import { addMember } from '../../src/accounts/organizations.js';
import { createDirectory } from '../../src/directory/directories.js';
import { createAuthorizationCode } from '../../src/oauth/models/authorization-codes.js';
import { sha256Hex } from '../../src/lib/crypto.js';
import { REMOVAL_MARGIN_S } from '../../src/oauth/models/grants.js';
import { KNOWN_SCOPES } from '../../src/oauth/helpers/scopes.js';
import { testConfig } from '../helpers/app.js';
import { BACKEND } from '../helpers/db.js';
import { type InstancePair, startInstancePair } from '../helpers/instance-pair.js';
import { finishJobs } from '../helpers/jobs.js';
import { basic, clientCredentialsToken, createOrgFixture, form, type OrgFixture } from '../helpers/oauth.js';
import { ENTERPRISE, ERROR, GROUP, LIST, PATCH_OP, USER } from '../helpers/scim.js';


let pair: InstancePair;
let t: InstancePair['t'];
let app: FastifyInstance;
/** Another instance on the same database: a deactivation through one is refused on the other at once. */
let second: FastifyInstance;
let org: OrgFixture;
let other: OrgFixture;
let publicAppId: number;
const db = () => t.handle.db;
const ISSUER = testConfig().issuer;

interface Directory {
  id: number;
  token: string;
}

async function verifiedDomain(organizationId: number, domain: string): Promise<void> {
  await db().insertInto('sso_domains').values({ organization_id: organizationId, domain, state: 'verified', verification_token: `token-${domain}`, verified_at: new Date() }).execute();
}

async function newDirectory(organizationId: number, input: Record<string, unknown> = {}): Promise<Directory> {
  const { directory, token } = await createDirectory(db(), organizationId, { name: 'IdP', ...input });
  return { id: directory.id, token };
}

beforeAll(async () => {
  // Neither instance runs jobs (JOB_WORKERS=0): the test finishes them when it chooses, so what it
  // sees in between is what a member with a million grants sees while the job walks them.
  pair = await startInstancePair({ env: { JOB_WORKERS: '0' } });
  ({ t, app, second } = pair);
  org = await createOrgFixture(db(), { scopes: KNOWN_SCOPES.join(' ') });
  other = await createOrgFixture(db(), { scopes: KNOWN_SCOPES.join(' ') });
  await verifiedDomain(org.organizationId, 'acme.example');
  await verifiedDomain(other.organizationId, 'globex.example');
  publicAppId = (await db().selectFrom('applications').select('id').where('client_id', '=', org.publicApp.client_id).executeTakeFirstOrThrow()).id;
});
afterAll(() => pair?.close());

/** A SCIM request as the IdP sends it: its bearer token, application/scim+json. */
async function scim(directory: Directory, method: 'GET' | 'POST' | 'PUT' | 'PATCH' | 'DELETE', path: string, body?: unknown, headers: Record<string, string> = {}): Promise<LightMyRequestResponse> {
  return app.inject({
    method,
    url: `/scim/v2/${directory.id}${path}`,
    headers: { authorization: `Bearer ${directory.token}`, ...(body === undefined ? {} : { 'content-type': 'application/scim+json' }), ...headers },
    ...(body === undefined ? {} : { payload: JSON.stringify(body) }),
  });
}

function ok(res: LightMyRequestResponse, status: number) {
  expect(res.statusCode, res.body).toBe(status);
  return res.body === '' ? undefined : res.json();
}

function scimError(res: LightMyRequestResponse, status: number, scimType?: string) {
  expect(res.statusCode, res.body).toBe(status);
  const body = res.json();
  expect(body).toMatchObject({ schemas: [ERROR], status: String(status), ...(scimType ? { scimType } : {}) });
  expect(res.headers['content-type']).toMatch(/^application\/scim\+json/);
  return body;
}

const membership = async (userId: number) =>
  db().selectFrom('memberships').select('role').where('organization_id', '=', org.organizationId).where('user_id', '=', userId).executeTakeFirst();

const accountOf = async (email: string) => db().selectFrom('users').select(['id', 'email', 'email_verified_at']).where('email', '=', email).executeTakeFirst();

/** The member's tokens from the organization's public application, through a code at the token endpoint. */
async function tokensOf(userId: number): Promise<{ access_token: string; refresh_token: string }> {
  const code = await createAuthorizationCode(db(), {
    organizationId: org.organizationId, applicationId: publicAppId, userId, redirectUri: 'https://client.example.com/cb', scopes: ['contacts.read'], codeChallenge: null, ttlSeconds: 60,
  });
  const res = await app.inject({
    method: 'POST',
    url: '/oauth/token',
    headers: { 'content-type': 'application/x-www-form-urlencoded', authorization: basic(org.publicApp.client_id, org.publicApp.client_secret) },
    payload: form({ grant_type: 'authorization_code', code, redirect_uri: 'https://client.example.com/cb' }),
  });
  expect(res.statusCode, res.body).toBe(200);
  return res.json();
}

const contacts = async (token: string, instance: FastifyInstance = app) => (await instance.inject({ method: 'GET', url: `/api/v1/${org.organizationId}/contacts`, headers: { authorization: `Bearer ${token}` } })).statusCode;
const liveGrants = async (userId: number) =>
  Number((await db().selectFrom('grants').select((eb) => eb.fn.countAll().as('n')).where('user_id', '=', userId).where('organization_id', '=', org.organizationId).where('revoked_at', 'is', null).executeTakeFirstOrThrow()).n);

describe(`SCIM on ${BACKEND}: an Okta-style client`, () => {
  let okta: Directory;
  beforeAll(async () => {
    okta = await newDirectory(org.organizationId, { name: 'Okta', default_role: 'member', group_roles: [{ group: 'Admins', role: 'admin' }] });
  });

  it('discovers the service: ServiceProviderConfig, ResourceTypes and Schemas', async () => {
    const config = ok(await scim(okta, 'GET', '/ServiceProviderConfig'), 200);
    expect(config).toMatchObject({ patch: { supported: true }, filter: { supported: true }, etag: { supported: true }, bulk: { supported: false } });
    const types = ok(await scim(okta, 'GET', '/ResourceTypes'), 200);
    expect(types.Resources.map((r: { id: string }) => r.id)).toEqual(['User', 'Group']);
    const schemas = ok(await scim(okta, 'GET', '/Schemas'), 200);
    expect(schemas.Resources.map((s: { id: string }) => s.id)).toEqual([USER, ENTERPRISE, GROUP]);
    expect(ok(await scim(okta, 'GET', `/Schemas/${USER}`), 200).attributes.some((a: { name: string }) => a.name === 'userName')).toBe(true);
  });

  it('provisions, updates, groups, deactivates, reactivates and deletes a person, as Okta sends it', async () => {
    // Okta asks whether the user exists first.
    const before = ok(await scim(okta, 'GET', `/Users?filter=${encodeURIComponent('userName eq "jane.doe@acme.example"')}&startIndex=1&count=100`), 200);
    expect(before).toEqual({ schemas: [LIST], totalResults: 0, startIndex: 1, itemsPerPage: 0, Resources: [] });

    const created = await scim(okta, 'POST', '/Users', {
      schemas: [USER],
      userName: 'jane.doe@acme.example',
      name: { givenName: 'Jane', familyName: 'Doe' },
      emails: [{ primary: true, value: 'jane.doe@acme.example', type: 'work' }],
      displayName: 'Jane Doe',
      locale: 'en-US',
      externalId: '00ujl29u0le5T6Aj10h7',
      groups: [],
      password: '1mz050nq',
      active: true,
    });
    const jane = ok(created, 201);
    expect(jane).toMatchObject({ schemas: expect.arrayContaining([USER]), id: expect.any(String), userName: 'jane.doe@acme.example', active: true, externalId: '00ujl29u0le5T6Aj10h7', name: { givenName: 'Jane', familyName: 'Doe' } });
    expect(jane).not.toHaveProperty('password');
    expect(created.headers.location).toBe(`${ISSUER}/scim/v2/${okta.id}/Users/${jane.id}`);
    expect(jane.meta).toMatchObject({ resourceType: 'User', location: created.headers.location, version: created.headers.etag });
    const account = await accountOf('jane.doe@acme.example');
    expect(account?.email_verified_at).not.toBeNull();
    expect(await membership(account!.id)).toEqual({ role: 'member' });

    // Found by the same filter now, and read by id.
    const found = ok(await scim(okta, 'GET', `/Users?filter=${encodeURIComponent('userName eq "JANE.DOE@acme.example"')}`), 200);
    expect(found.Resources.map((u: { id: string }) => u.id)).toEqual([jane.id]);
    expect(ok(await scim(okta, 'GET', `/Users/${jane.id}`), 200)).toEqual(jane);

    // A second create of the same userName: 409 uniqueness.
    scimError(await scim(okta, 'POST', '/Users', { schemas: [USER], userName: 'Jane.Doe@acme.example', active: true }), 409, 'uniqueness');

    // Okta's PUT update.
    const put = ok(await scim(okta, 'PUT', `/Users/${jane.id}`, { ...jane, name: { givenName: 'Janet', familyName: 'Doe' }, displayName: 'Janet Doe' }), 200);
    expect(put).toMatchObject({ id: jane.id, displayName: 'Janet Doe', name: { givenName: 'Janet', familyName: 'Doe' } });

    // A mapped group: its members become admins.
    const admins = ok(await scim(okta, 'POST', '/Groups', { schemas: [GROUP], displayName: 'Admins', members: [] }), 201);
    ok(await scim(okta, 'PATCH', `/Groups/${admins.id}`, { schemas: [PATCH_OP], Operations: [{ op: 'add', path: 'members', value: [{ value: jane.id, display: 'jane.doe@acme.example' }] }] }), 204);
    expect(await membership(account!.id)).toEqual({ role: 'admin' });
    expect(ok(await scim(okta, 'GET', `/Users/${jane.id}`), 200).groups).toEqual([expect.objectContaining({ value: admins.id, display: 'Admins' })]);
    // Okta removes with a value filter: back to the default role.
    ok(await scim(okta, 'PATCH', `/Groups/${admins.id}`, { schemas: [PATCH_OP], Operations: [{ op: 'remove', path: `members[value eq "${jane.id}"]` }] }), 204);
    expect(await membership(account!.id)).toEqual({ role: 'member' });

    // Deactivation (Okta: a path-less replace of active): the token is refused on the next request, the grants end by the job.
    const tokens = await tokensOf(account!.id);
    expect(await contacts(tokens.access_token)).toBe(200);
    expect(await liveGrants(account!.id)).toBe(1);
    const session = await db().insertInto('sessions').values({ id_hash: sha256Hex(`session-${jane.id}`), user_id: account!.id, expires_at: new Date(Date.now() + 3600_000) }).returning('id_hash').executeTakeFirstOrThrow();
    const off = ok(await scim(okta, 'PATCH', `/Users/${jane.id}`, { schemas: [PATCH_OP], Operations: [{ op: 'replace', value: { active: false } }] }), 200);
    expect(off.active).toBe(false);
    expect(await contacts(tokens.access_token)).toBe(401);
    // On the other instance within a second (its revoked set hears of the removal), while every grant is still live.
    await expect.poll(() => contacts(tokens.access_token, second), { timeout: 1000, interval: 20 }).toBe(401);
    expect(await liveGrants(account!.id)).toBe(1);
    expect(await membership(account!.id)).toBeUndefined();
    expect(await db().selectFrom('sessions').select('id_hash').where('id_hash', '=', session.id_hash).executeTakeFirst()).toBeUndefined();
    await finishJobs(db());
    expect(await liveGrants(account!.id)).toBe(0);
    expect(await accountOf('jane.doe@acme.example')).toBeDefined();

    // Reactivation: a member again, with a fresh token working; the old grant stays ended.
    const on = ok(await scim(okta, 'PATCH', `/Users/${jane.id}`, { schemas: [PATCH_OP], Operations: [{ op: 'replace', value: { active: true } }] }), 200);
    expect(on.active).toBe(true);
    expect(await membership(account!.id)).toEqual({ role: 'member' });
    expect(await contacts(tokens.access_token)).toBe(401);
    // Tokens issued in the second of the removal and REMOVAL_MARGIN_S more are refused with it
    // (member-removal.test.ts): the clock is moved on by that much rather than waited for.
    vi.useFakeTimers({ toFake: ['Date'], shouldAdvanceTime: true });
    onTestFinished(() => void vi.useRealTimers());
    vi.setSystemTime(Date.now() + (REMOVAL_MARGIN_S + 1) * 1000 + 100);
    expect(await contacts((await tokensOf(account!.id)).access_token)).toBe(200);

    // DELETE: the membership removed, the account kept, the SCIM id gone.
    ok(await scim(okta, 'DELETE', `/Users/${jane.id}`), 204);
    expect(await membership(account!.id)).toBeUndefined();
    expect(await accountOf('jane.doe@acme.example')).toBeDefined();
    scimError(await scim(okta, 'GET', `/Users/${jane.id}`), 404);

    const actions = await db().selectFrom('audit_events').select('action').where('organization_id', '=', org.organizationId).where('action', 'like', 'directory.%').orderBy('id').execute();
    expect(actions.map((a) => a.action).filter((a) => /^directory\.(user|group)\./.test(a))).toEqual([
      'directory.user.created', 'directory.user.updated', 'directory.group.created', 'directory.group.updated', 'directory.group.updated',
      'directory.user.deactivated', 'directory.user.reactivated', 'directory.user.deleted',
    ]);
  });
});

describe(`SCIM on ${BACKEND}: an Entra ID-style client`, () => {
  /** Entra's provisioning service, with (`aadOptscim062020`) or without the flag that makes its PATCH requests RFC 7644's. */
  for (const flag of [true, false]) {
    it(`provisions, updates, groups and deprovisions a person as Entra ID sends it, ${flag ? 'with' : 'without'} aadOptscim062020`, async () => {
      const entra = await newDirectory(org.organizationId, { name: `Entra ${flag}`, default_role: 'viewer', group_roles: [{ group: 'Org Members', role: 'member' }] });
      const upn = `alex.${flag ? 'flag' : 'legacy'}@acme.example`;
      const filter = (text: string) => `?filter=${encodeURIComponent(text)}`;
      expect(ok(await scim(entra, 'GET', `/Users${filter(`userName eq "${upn}"`)}`), 200).totalResults).toBe(0);

      // Entra's create, from Microsoft's SCIM reference (userName is the UPN; a meta and an empty roles list come with it).
      const alex = ok(
        await scim(entra, 'POST', '/Users', {
          schemas: [USER, ENTERPRISE],
          externalId: `0a21f0f2-8d2a-4f8e-bf98-7363c4aed4e${flag ? 'f' : '0'}`,
          userName: upn,
          active: true,
          emails: [{ primary: true, type: 'work', value: upn }],
          meta: { resourceType: 'User' },
          name: { formatted: 'Alex Wilber', familyName: 'Wilber', givenName: 'Alex' },
          roles: [],
          [ENTERPRISE]: { department: 'Sales', employeeNumber: '1001' },
        }),
        201,
      );
      expect(alex).toMatchObject({ userName: upn, active: true, [ENTERPRISE]: { department: 'Sales', employeeNumber: '1001' } });
      const account = await accountOf(upn);
      expect(await membership(account!.id)).toEqual({ role: 'viewer' });
      expect(ok(await scim(entra, 'GET', `/Users${filter(`userName eq "${upn}"`)}`), 200).Resources.map((u: { id: string }) => u.id)).toEqual([alex.id]);
      expect(ok(await scim(entra, 'GET', `/Users${filter(`externalId eq "${alex.externalId}"`)}`), 200).totalResults).toBe(1);

      // Attribute updates: a value-path into emails, a sub-attribute, the enterprise extension.
      const moved = `alex.wilber.${flag ? 'flag' : 'legacy'}@acme.example`;
      const updated = ok(
        await scim(entra, 'PATCH', `/Users/${alex.id}`, {
          schemas: [PATCH_OP],
          Operations: [
            { op: 'Replace', path: 'emails[type eq "work"].value', value: moved },
            { op: 'Replace', path: 'name.familyName', value: 'Wilber-Smith' },
            { op: flag ? 'Replace' : 'Add', path: `${ENTERPRISE}:department`, value: 'Marketing' },
          ],
        }),
        200,
      );
      expect(updated.emails).toEqual([{ primary: true, type: 'work', value: moved }]);
      expect(updated.name).toMatchObject({ familyName: 'Wilber-Smith', givenName: 'Alex' });
      expect(updated[ENTERPRISE]).toMatchObject({ department: 'Marketing' });
      // The account's address follows the directory (still the organization's verified domain).
      expect((await db().selectFrom('users').select('email').where('id', '=', account!.id).executeTakeFirstOrThrow()).email).toBe(moved);

      // Groups: created without members, found by displayName with members excluded, then PATCHed.
      const group = ok(
        await scim(entra, 'POST', '/Groups', {
          schemas: [GROUP, 'http://schemas.microsoft.com/2006/11/ResourceManagement/ADSCIM/Group'],
          externalId: `8aa1a0c0-c4c3-4bc0-b4a5-2ef67690015${flag ? '9' : '0'}`,
          displayName: 'Org Members',
          meta: { resourceType: 'Group' },
        }),
        201,
      );
      const listed = ok(await scim(entra, 'GET', `/Groups?excludedAttributes=members&${filter('displayName eq "Org Members"').slice(1)}`), 200);
      expect(listed.Resources).toEqual([expect.not.objectContaining({ members: expect.anything() })]);
      expect(listed.Resources[0].id).toBe(group.id);
      ok(await scim(entra, 'PATCH', `/Groups/${group.id}`, { schemas: [PATCH_OP], Operations: [{ op: 'Add', path: 'members', value: [{ $ref: null, value: alex.id }] }] }), 204);
      expect(await membership(account!.id)).toEqual({ role: 'member' });
      // Entra asks whether a user is in a group with a filter on members.
      const check = ok(await scim(entra, 'GET', `/Groups${filter(`id eq "${group.id}" and members[value eq "${alex.id}"]`)}&excludedAttributes=members`), 200);
      expect(check.totalResults).toBe(1);
      ok(await scim(entra, 'PATCH', `/Groups/${group.id}`, { schemas: [PATCH_OP], Operations: [{ op: 'Replace', path: 'displayName', value: 'Org Members (renamed)' }] }), 204);
      // Renaming a mapped group away from its mapping is a role change for its members: the job syncs them.
      await finishJobs(db());
      expect(await membership(account!.id)).toEqual({ role: 'viewer' });
      ok(await scim(entra, 'PATCH', `/Groups/${group.id}`, { schemas: [PATCH_OP], Operations: [{ op: 'Replace', path: 'displayName', value: 'Org Members' }] }), 204);
      await finishJobs(db());
      expect(await membership(account!.id)).toEqual({ role: 'member' });
      // Entra's removal: the path is members and the value names who goes.
      ok(await scim(entra, 'PATCH', `/Groups/${group.id}`, { schemas: [PATCH_OP], Operations: [{ op: 'Remove', path: 'members', value: [{ value: alex.id }] }] }), 204);
      expect(await membership(account!.id)).toEqual({ role: 'viewer' });
      expect(ok(await scim(entra, 'GET', `/Groups/${group.id}`), 200).members ?? []).toEqual([]);

      // Deactivation: a boolean with the flag, the string "False" without it.
      const tokens = await tokensOf(account!.id);
      expect(await contacts(tokens.access_token)).toBe(200);
      const off = ok(await scim(entra, 'PATCH', `/Users/${alex.id}`, { schemas: [PATCH_OP], Operations: [{ op: 'Replace', path: 'active', value: flag ? false : 'False' }] }), 200);
      expect(off.active).toBe(false);
      expect(await contacts(tokens.access_token)).toBe(401);
      expect(await membership(account!.id)).toBeUndefined();
      await finishJobs(db());
      expect(await liveGrants(account!.id)).toBe(0);
      const on = ok(await scim(entra, 'PATCH', `/Users/${alex.id}`, { schemas: [PATCH_OP], Operations: [{ op: 'Replace', path: 'active', value: flag ? true : 'True' }] }), 200);
      expect(on.active).toBe(true);
      expect(await membership(account!.id)).toEqual({ role: 'viewer' });

      ok(await scim(entra, 'DELETE', `/Users/${alex.id}`), 204);
      expect(await membership(account!.id)).toBeUndefined();
      ok(await scim(entra, 'DELETE', `/Groups/${group.id}`), 204);
      scimError(await scim(entra, 'GET', `/Groups/${group.id}`), 404);
    });
  }
});

describe(`SCIM on ${BACKEND}: accounts that exist, owners, and the directory's own settings`, () => {
  it('links an existing account of a verified domain instead of making another, leaves an owner an owner, and follows a new default role and mappings', async () => {
    const directory = await newDirectory(org.organizationId, { name: 'Claims', default_role: 'member' });
    // An account that signed up by itself with an address of the domain, not yet a member.
    const existing = await createAccount(db(), { email: 'pat@acme.example', password: 'pat-password-1' });
    await db().updateTable('users').set({ email_verified_at: new Date() }).where('id', '=', existing.id).execute();
    const pat = ok(await scim(directory, 'POST', '/Users', { schemas: [USER], userName: 'pat@acme.example', active: true }), 201);
    expect(await db().selectFrom('users').select('id').where('email', '=', 'pat@acme.example').execute()).toEqual([{ id: existing.id }]);
    expect(await membership(existing.id)).toEqual({ role: 'member' });

    // An owner of the organization, provisioned and then deactivated: still the owner (owners are unmade by people).
    const ownerEmail = 'founder@acme.example';
    const founder = await createAccount(db(), { email: ownerEmail, password: 'founder-password-1' });
    await db().updateTable('users').set({ email_verified_at: new Date() }).where('id', '=', founder.id).execute();
    await addMember(db(), { organizationId: org.organizationId, userId: founder.id, role: 'owner' });
    const owner = ok(await scim(directory, 'POST', '/Users', { schemas: [USER], userName: ownerEmail, active: true }), 201);
    ok(await scim(directory, 'PATCH', `/Users/${owner.id}`, { schemas: [PATCH_OP], Operations: [{ op: 'replace', value: { active: false } }] }), 200);
    expect(await membership(founder.id)).toEqual({ role: 'owner' });

    // A new default role: the members the directory added follow, by the job.
    const admin = await app.inject({
      method: 'PATCH',
      url: `/api/v1/${org.organizationId}/directories/${directory.id}`,
      headers: { authorization: `Bearer ${await adminToken()}` },
      payload: { default_role: 'viewer', group_roles: [{ group: 'Leads', role: 'admin' }] },
    });
    expect(admin.statusCode, admin.body).toBe(200);
    await finishJobs(db());
    expect(await membership(existing.id)).toEqual({ role: 'viewer' });
    const leads = ok(await scim(directory, 'POST', '/Groups', { schemas: [GROUP], displayName: 'leads', members: [{ value: pat.id }] }), 201);
    expect(leads.members).toEqual([expect.objectContaining({ value: pat.id })]);
    expect(await membership(existing.id)).toEqual({ role: 'admin' });
    expect(await membership(founder.id)).toEqual({ role: 'owner' });
  });

  it('refuses a mapping that gives a role the caller could not give by hand', async () => {
    const directory = await newDirectory(org.organizationId, { name: 'Narrow' });
    const narrow = await clientCredentialsToken(app, org, 'directory.read directory.write');
    const res = await app.inject({
      method: 'PATCH',
      url: `/api/v1/${org.organizationId}/directories/${directory.id}`,
      headers: { authorization: `Bearer ${narrow}` },
      payload: { group_roles: [{ group: 'Everyone', role: 'admin' }] },
    });
    expect(res.statusCode, res.body).toBe(403);
    expect((await app.inject({ method: 'POST', url: `/api/v1/${org.organizationId}/directories`, headers: { authorization: `Bearer ${narrow}` }, payload: { name: 'x', default_role: 'admin' } })).statusCode).toBe(403);
    // Renaming is not a role change.
    const renamed = await app.inject({ method: 'PATCH', url: `/api/v1/${org.organizationId}/directories/${directory.id}`, headers: { authorization: `Bearer ${narrow}` }, payload: { name: 'Narrow (renamed)' } });
    expect(renamed.statusCode, renamed.body).toBe(200);
  });
});

async function adminToken(): Promise<string> {
  return clientCredentialsToken(app, org);
}
