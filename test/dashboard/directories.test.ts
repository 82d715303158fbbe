/**
 * The dashboard's Directory sync page (/dashboard/directories, issue 43): owners and admins
 * (directory.read and directory.write) create a directory and see its token once (only its hash is
 * kept), rotate it (the old one is refused by the SCIM service at once), disable it, change its
 * default role, map groups to roles and remove the mappings, and delete it after confirming; a
 * custom role holding directory.write is offered, and may give, only the roles it could give by
 * hand; directory.read alone sees the pages without a form; members and viewers are refused the
 * pages and their forms. What the real SCIM service was sent (users, groups, the requests and
 * their answers) is on the directory's page, the users keyset-paged and searched by userName
 * prefix, the groups paged. One app and one database for the file.
 */
import type { LightMyRequestResponse } from 'fastify';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { addMember } from '../../src/accounts/organizations.js';
import { createRole } from '../../src/accounts/roles.js';
import { createUser } from '../../src/accounts/users.js';
import { createDirectory } from '../../src/directory/directories.js';
import { sha256Hex } from '../../src/lib/crypto.js';
import { Browser, expectPageSecurityHeaders } from '../accounts/browser.js';
import { testConfig } from '../helpers/app.js';
import { BACKEND } from '../helpers/db.js';
import { createWorld, newOrganization, PASSWORD, selectOrganization, submit, type World } from './fixture.js';

const USER = 'urn:ietf:params:scim:schemas:core:2.0:User';
const GROUP = 'urn:ietf:params:scim:schemas:core:2.0:Group';
const ISSUER = testConfig().issuer;
const PATH = '/dashboard/directories';

let w: World;
/** A built-in viewer, a custom role with directory.read alone, and one with directory.write and what a viewer holds. */
const extra = {} as Record<'viewer' | 'reader' | 'manager', { id: number; browser: Browser }>;
let ip = 0;

beforeAll(async () => {
  w = await createWorld({ env: { JOB_WORKERS: '0' } });
  for (const name of ['viewer', 'reader', 'manager'] as const) {
    const user = await createUser(w.db, { email: `directories-${name}-${process.pid}@example.com`, password: PASSWORD, name });
    const browser = new Browser(w.app, `10.23.0.${++ip}`);
    expect((await browser.login(user.email, PASSWORD)).statusCode).toBe(303);
    extra[name] = { id: user.id, browser };
  }
});
afterAll(async () => {
  await w?.close();
});

/** A new organization (the fixture's owner, admin and member) with the viewer, the reader and the manager, and a verified domain. */
async function newDirectoryOrganization() {
  const org = await newOrganization(w);
  await addMember(w.db, { organizationId: org.id, userId: extra.viewer.id, role: 'viewer' });
  const reader = await createRole(w.db, org.id, { name: 'directory-reader', permissions: ['directory.read'] });
  await addMember(w.db, { organizationId: org.id, userId: extra.reader.id, role: reader });
  const manager = await createRole(w.db, org.id, { name: 'directory-manager', permissions: ['directory.read', 'directory.write', 'contacts.read', 'tasks.read'] });
  await addMember(w.db, { organizationId: org.id, userId: extra.manager.id, role: manager });
  for (const name of ['viewer', 'reader', 'manager'] as const) expect((await selectOrganization(extra[name].browser, org.id)).statusCode).toBe(303);
  const domain = `org${org.id}-${process.pid}.example`;
  await w.db.insertInto('sso_domains').values({ organization_id: org.id, domain, state: 'verified', verification_token: `token-${domain}`, verified_at: new Date() }).execute();
  return { ...org, domain };
}

const owner = () => w.browsers.owner;
const alertIn = (html: string) => /<div class="error" role="alert"><ul>([\s\S]*?)<\/ul>/.exec(html)?.[1] ?? '';
const tokenIn = (html: string) => /id="scim-token" name="scim_token" value="(scim_[A-Za-z0-9_-]+)"/.exec(html)?.[1];
const directoriesOf = (organizationId: number) => w.db.selectFrom('directories').selectAll().where('organization_id', '=', organizationId).orderBy('id').execute();
const mappingsOf = async (directoryId: number) =>
  (await w.db.selectFrom('directory_group_roles').select(['group_ref', 'role']).where('directory_id', '=', directoryId).execute()).sort((a, b) => a.group_ref.toLowerCase().localeCompare(b.group_ref.toLowerCase()));
/** The text of a table's body rows (tags dropped), for what a list shows. */
const rowsOf = (html: string, table: string) =>
  [...(new RegExp(`<table class="${table}">[\\s\\S]*?<tbody>([\\s\\S]*?)</tbody>`).exec(html)?.[1] ?? '').matchAll(/<tr[^>]*>([\s\S]*?)<\/tr>/g)].map((m) =>
    m[1]!.replace(/<[^>]+>/g, ' ').replace(/\s+/g, ' ').trim(),
  );

/** A SCIM request with the directory's bearer token, as the IdP sends it. */
function scim(directoryId: number, token: string, method: 'GET' | 'POST' | 'PATCH', path: string, body?: unknown): Promise<LightMyRequestResponse> {
  return w.app.inject({
    method,
    url: `/scim/v2/${directoryId}${path}`,
    headers: { authorization: `Bearer ${token}`, ...(body === undefined ? {} : { 'content-type': 'application/scim+json' }) },
    ...(body === undefined ? {} : { payload: JSON.stringify(body) }),
  });
}

/** Follows a 303 back to a directory page, in the same browser. */
async function follow(b: Browser, res: LightMyRequestResponse): Promise<LightMyRequestResponse> {
  expect(res.statusCode, alertIn(res.body) || res.body.slice(0, 300)).toBe(303);
  const location = String(res.headers.location);
  expect(location.startsWith(PATH)).toBe(true);
  return b.get(location.split('#')[0]!);
}

describe(`dashboard directories on ${BACKEND}`, () => {
  it('shows the page in the navigation of owners and admins, with the page security headers and no inline script', async () => {
    await newDirectoryOrganization();
    for (const b of [owner(), w.browsers.admin]) {
      const page = await b.get(PATH);
      expect(page.statusCode).toBe(200);
      expectPageSecurityHeaders(page);
      expect(page.body).toContain(`<a href="${PATH}" aria-current="page">Directory sync</a>`);
      expect(page.body).toContain('<h2 id="add-directory">Create a directory</h2>');
      expect(page.body).toContain('data-empty="directories"');
      expect(page.body).not.toMatch(/<script(?![^>]*\bsrc=)/);
    }
    for (const b of [w.browsers.member, extra.viewer.browser]) expect((await b.get('/dashboard')).body).not.toContain(`href="${PATH}"`);
    expect((await extra.reader.browser.get('/dashboard')).body).toContain(`href="${PATH}"`);
  });

  it('creates a directory: the token is shown in the answer once, only its hash is kept, and the change is audited with the member', async () => {
    const org = await newDirectoryOrganization();
    const res = await submit(owner(), PATH, { name: 'Okta', default_role: 'viewer' });
    expect(res.statusCode, alertIn(res.body)).toBe(201);
    expect(res.headers['cache-control']).toContain('no-store');
    const token = tokenIn(res.body)!;
    expect(token).toMatch(/^scim_[A-Za-z0-9_-]{43}$/);
    const [row] = await directoriesOf(org.id);
    expect(row).toMatchObject({ name: 'Okta', state: 'active', default_role: 'viewer', token_hash: sha256Hex(token) });
    expect(res.body).toContain(`<code class="copy" id="scim-base-url">${ISSUER}/scim/v2/${row!.id}</code>`);
    expect((await scim(row!.id, token, 'GET', '/Users')).statusCode).toBe(200);
    // Never again: the list and the directory's page show its base URL, not its token.
    for (const url of [PATH, `${PATH}/${row!.id}`]) {
      const page = await owner().get(url);
      expect(page.statusCode).toBe(200);
      expect(page.body).toContain(`${ISSUER}/scim/v2/${row!.id}`);
      expect(page.body).not.toContain(token);
      expect(page.body).not.toContain('scim_');
    }
    expect(rowsOf((await owner().get(PATH)).body, 'directories')).toEqual([expect.stringMatching(new RegExp(`^Okta active ${ISSUER}/scim/v2/${row!.id} viewer 0 0 \\d{4}-`))]);
    const audit = await w.db.selectFrom('audit_events').select(['actor_user_id', 'details']).where('organization_id', '=', org.id).where('action', '=', 'directory.created').executeTakeFirstOrThrow();
    expect(audit).toEqual({ actor_user_id: w.users.owner.id, details: { directory_id: row!.id, name: 'Okta', default_role: 'viewer', group_roles: [] } });
    expect(JSON.stringify(audit)).not.toContain(token);
  });

  it('shows a refusal on the page, with what was typed, at its status; never an owner', async () => {
    const org = await newDirectoryOrganization();
    const empty = await submit(owner(), PATH, { name: '  ', default_role: 'member' });
    expect(empty.statusCode).toBe(400);
    expect(alertIn(empty.body)).toContain('Name: must not be empty');
    const ownerRole = await submit(owner(), PATH, { name: 'Typed', default_role: 'owner' });
    expect(ownerRole.statusCode).toBe(400);
    expect(alertIn(ownerRole.body)).toContain('Default role: must be one of viewer, member, admin');
    expect(ownerRole.body).toContain('value="Typed"');
    expect(ownerRole.body).not.toContain('<option value="owner"');
    expect(await directoriesOf(org.id)).toEqual([]);
  });

  it('rotates the token: the new one shown once, the old one refused by the SCIM service at once', async () => {
    const org = await newDirectoryOrganization();
    const { directory, token } = await createDirectory(w.db, org.id, { name: 'Entra' });
    const res = await submit(w.browsers.admin, `${PATH}/${directory.id}/rotate-token`);
    expect(res.statusCode).toBe(200);
    expect(res.headers['cache-control']).toContain('no-store');
    const rotated = tokenIn(res.body)!;
    expect(rotated).toMatch(/^scim_/);
    expect(rotated).not.toBe(token);
    expect(res.body).toContain('The old token no longer works');
    expect(res.body).toContain(`<code class="copy" id="scim-base-url">${ISSUER}/scim/v2/${directory.id}</code>`);
    expect((await directoriesOf(org.id))[0]!.token_hash).toBe(sha256Hex(rotated));
    expect((await scim(directory.id, token, 'GET', '/Users')).statusCode).toBe(401);
    expect((await scim(directory.id, rotated, 'GET', '/Users')).statusCode).toBe(200);
    const audit = await w.db.selectFrom('audit_events').select(['actor_user_id', 'details']).where('organization_id', '=', org.id).where('action', '=', 'directory.token_rotated').executeTakeFirstOrThrow();
    expect(audit).toEqual({ actor_user_id: w.users.admin.id, details: { directory_id: directory.id } });
    expect((await owner().get(`${PATH}/${directory.id}`)).body).not.toContain(rotated);
  });

  it('maps groups to roles and removes mappings, changes the default role and the name, disables and enables', async () => {
    const org = await newDirectoryOrganization();
    const { directory, token } = await createDirectory(w.db, org.id, { name: 'Okta' });
    const page = `${PATH}/${directory.id}`;
    const mapped = await follow(owner(), await submit(owner(), `${page}/mappings`, { group: 'Engineering', role: 'admin' }));
    expect(mapped.body).toContain('Members of the group Engineering get the role admin from Okta.');
    expect(rowsOf(mapped.body, 'mappings')).toEqual(['Engineering admin Remove the mapping of Engineering']);
    await follow(owner(), await submit(owner(), `${page}/mappings`, { group: 'Sales', role: 'viewer' }));
    // The same group (without case) again: its role changes.
    await follow(owner(), await submit(owner(), `${page}/mappings`, { group: 'engineering', role: 'member' }));
    expect(await mappingsOf(directory.id)).toEqual([{ group_ref: 'engineering', role: 'member' }, { group_ref: 'Sales', role: 'viewer' }]);
    // Never owner.
    const refused = await submit(owner(), `${page}/mappings`, { group: 'Founders', role: 'owner' });
    expect(refused.statusCode).toBe(400);
    expect(alertIn(refused.body)).toContain('Role: must be one of viewer, member, admin (a directory never makes owners)');
    expect(refused.body).toContain('value="Founders"');
    const removed = await follow(owner(), await submit(owner(), `${page}/mappings/remove`, { group: 'Sales' }));
    expect(removed.body).toContain('The group Sales no longer gives a role in Okta.');
    expect(await mappingsOf(directory.id)).toEqual([{ group_ref: 'engineering', role: 'member' }]);
    expect((await submit(owner(), `${page}/mappings/remove`, { group: 'Sales' })).statusCode).toBe(404);

    const saved = await follow(owner(), await submit(owner(), page, { name: 'Okta (prod)', default_role: 'viewer' }));
    expect(saved.body).toContain('Directory Okta (prod) saved. The members it provisioned get their new roles in a moment.');
    expect((await directoriesOf(org.id))[0]).toMatchObject({ name: 'Okta (prod)', default_role: 'viewer' });

    const disabled = await follow(owner(), await submit(owner(), `${page}/state`, { state: 'disabled' }));
    expect(disabled.body).toContain('is disabled: its SCIM requests are refused');
    expect((await scim(directory.id, token, 'GET', '/Users')).statusCode).toBe(401);
    await follow(owner(), await submit(owner(), `${page}/state`, { state: 'active' }));
    expect((await scim(directory.id, token, 'GET', '/Users')).statusCode).toBe(200);

    const actions = await w.db.selectFrom('audit_events').select(['action', 'actor_user_id']).where('organization_id', '=', org.id).where('action', '=', 'directory.updated').execute();
    expect(actions).toHaveLength(7);
    expect(new Set(actions.map((a) => a.actor_user_id))).toEqual(new Set([w.users.owner.id]));
  });

  it('deletes a directory after confirming: its token stops with it', async () => {
    const org = await newDirectoryOrganization();
    const { directory, token } = await createDirectory(w.db, org.id, { name: 'Old IdP' });
    const confirm = await submit(owner(), `${PATH}/${directory.id}/delete`);
    expect(confirm.statusCode).toBe(200);
    expect(confirm.body).toContain('name="confirm" value="delete"');
    expect(await directoriesOf(org.id)).toHaveLength(1);
    const list = await follow(owner(), await submit(owner(), `${PATH}/${directory.id}/delete`, { confirm: 'delete' }));
    expect(list.body).toContain('Deleted the directory Old IdP: its token no longer works.');
    expect(await directoriesOf(org.id)).toEqual([]);
    expect((await scim(directory.id, token, 'GET', '/Users')).statusCode).toBe(401);
  });

  it('shows the users and groups the SCIM service was sent, their roles here, and the requests with their answers', async () => {
    const org = await newDirectoryOrganization();
    const { directory, token } = await createDirectory(w.db, org.id, { name: 'Okta', group_roles: [{ group: 'Admins', role: 'admin' }] });
    const post = async (path: string, body: unknown) => {
      const res = await scim(directory.id, token, 'POST', path, body);
      expect(res.statusCode, res.body).toBe(201);
      return res.json() as { id: string };
    };
    const jane = await post('/Users', { schemas: [USER], userName: `jane@${org.domain}`, displayName: 'Jane Doe', emails: [{ value: `jane@${org.domain}`, type: 'work', primary: true }], active: true });
    await post('/Users', { schemas: [USER], userName: `joe@${org.domain}`, displayName: 'Joe <b>Bloggs</b>', active: true });
    const admins = await post('/Groups', { schemas: [GROUP], displayName: 'Admins', members: [{ value: jane.id }] });
    await post('/Groups', { schemas: [GROUP], displayName: 'Everyone', members: [] });
    // Refused: an address outside the organization's verified domains.
    expect((await scim(directory.id, token, 'POST', '/Users', { schemas: [USER], userName: 'mallory@elsewhere.example', active: true })).statusCode).toBe(400);
    // Deactivated: not a member any more.
    const off = await scim(directory.id, token, 'PATCH', `/Users/${jane.id}`, { schemas: ['urn:ietf:params:scim:api:messages:2.0:PatchOp'], Operations: [{ op: 'replace', value: { active: false } }] });
    expect(off.statusCode, off.body).toBe(200);

    // The request log is written once each answer is sent.
    await vi.waitFor(async () => expect(await w.db.selectFrom('directory_requests').select('id').where('directory_id', '=', directory.id).execute()).toHaveLength(6));
    for (const b of [owner(), extra.reader.browser]) {
      const page = await b.get(`${PATH}/${directory.id}`);
      expect(page.statusCode).toBe(200);
      expect(rowsOf(page.body, 'directory-users')).toEqual([
        expect.stringMatching(new RegExp(`^jane@${org.domain} Jane Doe no not a member \\d{4}-`)),
        expect.stringMatching(new RegExp(`^joe@${org.domain} Joe &lt;b&gt;Bloggs&lt;/b&gt; yes member \\d{4}-`)),
      ]);
      expect(rowsOf(page.body, 'directory-groups')).toEqual([expect.stringMatching(/^Admins 1 admin \d{4}-/), expect.stringMatching(/^Everyone 0 – \d{4}-/)]);
      expect(rowsOf(page.body, 'directory-requests').map((r) => r.replace(/^\S+ \S+ UTC /, ''))).toEqual([
        `PATCH /Users/${jane.id} 200 –`,
        'POST /Users 400 (refused) invalidValue',
        'POST /Groups 201 –',
        'POST /Groups 201 –',
        'POST /Users 201 –',
        'POST /Users 201 –',
      ]);
      expect(page.body).toContain('<dt>Users</dt><dd>2</dd>');
    }
    expect(admins.id).toMatch(/^[0-9a-f-]{36}$/);
    expect(rowsOf((await owner().get(PATH)).body, 'directories')[0]).toMatch(/ member 1 2 \d{4}-/);
  });

  it('pages the users by seq and searches them by userName prefix; pages the groups', async () => {
    const org = await newDirectoryOrganization();
    const { directory } = await createDirectory(w.db, org.id, { name: 'Bulk' });
    const N = 130;
    const names = Array.from({ length: N }, (_, i) => `Bulk-${String(i).padStart(3, '0')}@${org.domain}`);
    const users = await w.db
      .insertInto('users')
      .values(names.map((email) => ({ email: email.toLowerCase(), name: email, password_hash: null, updated_at: new Date() })))
      .returning('id')
      .execute();
    // Seeded in reverse: SCIM order (seq) is not userName order.
    await w.db
      .insertInto('directory_users')
      .values(users.map((u, i) => ({ directory_id: directory.id, user_id: u.id, user_name: names[i]!, display_name: null, resource: '{}', updated_at: new Date() })).reverse())
      .execute();
    await w.db
      .insertInto('directory_groups')
      .values(Array.from({ length: 101 }, (_, i) => ({ directory_id: directory.id, display_name: `Group ${String(i).padStart(3, '0')}`, updated_at: new Date() })))
      .execute();
    const userNamesIn = (html: string) => rowsOf(html, 'directory-users').map((r) => r.split(' ')[0]);
    const nextIn = (html: string, anchor: string) => new RegExp(`<a href="([^"]+#${anchor})">Next page`).exec(html)?.[1]?.replaceAll('&amp;', '&');

    const first = await owner().get(`${PATH}/${directory.id}`);
    expect(first.body).toContain('<dt>Users</dt><dd>130</dd>');
    expect(userNamesIn(first.body)).toEqual(names.slice(N - 100).reverse());
    const next = nextIn(first.body, 'users')!;
    expect(next).toMatch(new RegExp(`^${PATH}/${directory.id}\\?after=\\d+#users$`));
    const second = await owner().get(next);
    expect(userNamesIn(second.body)).toEqual(names.slice(0, N - 100).reverse());
    expect(nextIn(second.body, 'users')).toBeUndefined();
    expect(second.body).toContain(`<a href="${PATH}/${directory.id}#users">First page<span class="visually-hidden"> of users</span></a>`);

    // A prefix, without case, in userName order: bulk-1 is 100 to 129.
    const found = await owner().get(`${PATH}/${directory.id}?q=${encodeURIComponent('bULK-1')}`);
    expect(userNamesIn(found.body)).toEqual(names.slice(100));
    expect(found.body).toContain('value="bULK-1"');
    // More than a page of matches: the next page after the last one shown.
    const all = await owner().get(`${PATH}/${directory.id}?q=bulk`);
    expect(userNamesIn(all.body)).toEqual(names.slice(0, 100));
    const more = nextIn(all.body, 'users')!;
    expect(more).toMatch(/\?q=bulk&after=\d+#users$/);
    expect(userNamesIn((await owner().get(more)).body)).toEqual(names.slice(100));
    const none = await owner().get(`${PATH}/${directory.id}?q=${encodeURIComponent('bulk-%')}`);
    expect(rowsOf(none.body, 'directory-users')).toEqual([]);
    expect(none.body).toContain('No userName of this directory starts with “bulk-%”.');

    // Groups: 100, then 1.
    const groupsNext = nextIn(first.body, 'groups')!;
    expect(rowsOf(first.body, 'directory-groups')).toHaveLength(100);
    expect(rowsOf((await owner().get(groupsNext)).body, 'directory-groups')).toEqual([expect.stringMatching(/^Group 100 0 – /)]);
  });
});

describe(`dashboard directories: who may on ${BACKEND}`, () => {
  it('offers, and accepts, only the roles a member may give by hand', async () => {
    const org = await newDirectoryOrganization();
    const { directory } = await createDirectory(w.db, org.id, { name: 'Okta', default_role: 'viewer' });
    const manager = extra.manager.browser;
    const list = await manager.get(PATH);
    expect(list.body).toContain('<option value="viewer" selected>viewer</option>');
    expect(list.body).not.toContain('<option value="member"');
    const page = await manager.get(`${PATH}/${directory.id}`);
    expect(page.body).toContain(`action="${PATH}/${directory.id}/mappings"`);
    expect(page.body).not.toMatch(/<option value="(member|admin|owner)"/);
    const refused = await submit(manager, `${PATH}/${directory.id}/mappings`, { group: 'Engineering', role: 'admin' });
    expect(refused.statusCode).toBe(403);
    expect(alertIn(refused.body)).toContain('your role may not give the role admin');
    expect((await submit(manager, PATH, { name: 'Mine', default_role: 'member' })).statusCode).toBe(403);
    await follow(manager, await submit(manager, `${PATH}/${directory.id}/mappings`, { group: 'Support', role: 'viewer' }));
    expect(await mappingsOf(directory.id)).toEqual([{ group_ref: 'Support', role: 'viewer' }]);
    const made = await submit(manager, PATH, { name: 'Mine', default_role: 'viewer' });
    expect(made.statusCode, alertIn(made.body)).toBe(201);
    expect(rowsOf((await manager.get(`${PATH}/${directory.id}`)).body, 'mappings')).toEqual(['Support viewer Remove the mapping of Support']);
    // Once a group gives admin, the mappings are the manager's to see, not to change (they are replaced whole).
    await follow(owner(), await submit(owner(), `${PATH}/${directory.id}/mappings`, { group: 'Engineering', role: 'admin' }));
    const shown = await manager.get(`${PATH}/${directory.id}`);
    expect(rowsOf(shown.body, 'mappings')).toEqual(['Engineering admin', 'Support viewer']);
    expect(shown.body).not.toContain(`action="${PATH}/${directory.id}/mappings`);
    expect(shown.body).toContain('only someone who may give every role mapped here can change the mappings');
    const removal = await submit(manager, `${PATH}/${directory.id}/mappings/remove`, { group: 'Support' });
    expect(removal.statusCode).toBe(403);
    expect(await mappingsOf(directory.id)).toEqual([{ group_ref: 'Engineering', role: 'admin' }, { group_ref: 'Support', role: 'viewer' }]);
    // Its name is still theirs to change.
    await follow(manager, await submit(manager, `${PATH}/${directory.id}`, { name: 'Okta (renamed)', default_role: 'viewer' }));
    expect((await directoriesOf(org.id))[0]!.name).toBe('Okta (renamed)');
  });

  it('shows directory.read the pages without a form, and refuses its changes (403)', async () => {
    const org = await newDirectoryOrganization();
    const { directory } = await createDirectory(w.db, org.id, { name: 'Okta', group_roles: [{ group: 'Sales', role: 'viewer' }] });
    const reader = extra.reader.browser;
    for (const url of [PATH, `${PATH}/${directory.id}`]) {
      const page = await reader.get(url);
      expect(page.statusCode, url).toBe(200);
      expect(page.body).toContain(`${ISSUER}/scim/v2/${directory.id}`);
      expect(page.body).not.toContain('method="post" action="/dashboard/directories');
    }
    await expectNoChange(reader, org.id, directory.id);
  });

  it('refuses the pages and their forms to members and viewers (403), and sends the signed-out to sign in', async () => {
    const org = await newDirectoryOrganization();
    const { directory } = await createDirectory(w.db, org.id, { name: 'Okta', group_roles: [{ group: 'Sales', role: 'viewer' }] });
    for (const b of [w.browsers.member, extra.viewer.browser]) {
      for (const url of [PATH, `${PATH}/${directory.id}`]) {
        const page = await b.get(url);
        expect(page.statusCode, url).toBe(403);
        expectPageSecurityHeaders(page);
      }
      await expectNoChange(b, org.id, directory.id);
    }
    const anonymous = await new Browser(w.app, '10.23.1.1').get(`${PATH}/${directory.id}`);
    expect(anonymous.statusCode).toBe(303);
    expect(anonymous.headers.location).toMatch(/^\/login/);
  });

  it('refuses a form without the session’s CSRF token (403)', async () => {
    const org = await newDirectoryOrganization();
    const { directory } = await createDirectory(w.db, org.id, { name: 'Okta' });
    const before = await directoriesOf(org.id);
    expect((await owner().post(PATH, { name: 'No token' })).statusCode).toBe(403);
    const foreign = await w.browsers.admin.csrf('/dashboard');
    expect((await owner().post(PATH, { name: 'Foreign token', csrf_token: foreign })).statusCode).toBe(403);
    expect((await owner().post(`${PATH}/${directory.id}/rotate-token`, {})).statusCode).toBe(403);
    expect((await owner().post(`${PATH}/${directory.id}/delete`, { confirm: 'delete' })).statusCode).toBe(403);
    expect(await directoriesOf(org.id)).toEqual(before);
  });

  it('answers 404 for another organization’s directory', async () => {
    await newDirectoryOrganization();
    const theirs = (await w.db.selectFrom('organizations').select('id').where('name', '=', 'Outsider Org').executeTakeFirstOrThrow()).id;
    const { directory } = await createDirectory(w.db, theirs, { name: 'Theirs' });
    expect((await owner().get(`${PATH}/${directory.id}`)).statusCode).toBe(404);
    expect((await owner().get(`${PATH}/01`)).statusCode).toBe(404);
    for (const [url, fields] of [
      [`${PATH}/${directory.id}`, { name: 'Mine' }],
      [`${PATH}/${directory.id}/state`, { state: 'disabled' }],
      [`${PATH}/${directory.id}/mappings`, { group: 'Sales', role: 'viewer' }],
      [`${PATH}/${directory.id}/rotate-token`, {}],
      [`${PATH}/${directory.id}/delete`, { confirm: 'delete' }],
      [`${PATH}/99999999/rotate-token`, {}],
    ] as const) {
      expect((await submit(owner(), url, fields)).statusCode, url).toBe(404);
    }
    expect(await directoriesOf(theirs)).toMatchObject([{ id: directory.id, name: 'Theirs', state: 'active' }]);
  });
});

/** Every form of the pages, posted by `b`: each refused with 403, and the directory as it was. */
async function expectNoChange(b: Browser, organizationId: number, directoryId: number): Promise<void> {
  const before = await directoriesOf(organizationId);
  for (const [url, fields] of [
    [PATH, { name: 'New', default_role: 'viewer' }],
    [`${PATH}/${directoryId}`, { name: 'Renamed', default_role: 'viewer' }],
    [`${PATH}/${directoryId}/state`, { state: 'disabled' }],
    [`${PATH}/${directoryId}/mappings`, { group: 'Engineering', role: 'viewer' }],
    [`${PATH}/${directoryId}/mappings/remove`, { group: 'Sales' }],
    [`${PATH}/${directoryId}/rotate-token`, {}],
    [`${PATH}/${directoryId}/delete`, { confirm: 'delete' }],
  ] as const) {
    expect((await submit(b, url, fields)).statusCode, url).toBe(403);
  }
  expect(await directoriesOf(organizationId)).toEqual(before);
  expect(await mappingsOf(directoryId)).toEqual([{ group_ref: 'Sales', role: 'viewer' }]);
}
