import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { addMember } from '../../src/accounts/organizations.js';
import { createUser } from '../../src/accounts/users.js';
import { recordAuditEvent } from '../../src/audit/events.js';
import { sha256Hex } from '../../src/lib/crypto.js';
import { Browser, expectPageSecurityHeaders } from '../accounts/browser.js';
import { BACKEND } from '../helpers/db.js';
import { finishJobs } from '../helpers/jobs.js';
import {
  accessTokenIn,
  createWorld,
  grantRow,
  listContacts,
  newOrganization,
  PASSWORD,
  selectOrganization,
  submit,
  userGrant,
  type World,
} from './fixture.js';

let w: World;
beforeAll(async () => {
  w = await createWorld();
});
afterAll(async () => {
  await w?.close();
});

const role = async (organizationId: number, userId: number) =>
  (await w.db.selectFrom('memberships').select('role').where('organization_id', '=', organizationId).where('user_id', '=', userId).executeTakeFirst())?.role;

describe(`dashboard organization switcher on ${BACKEND}`, () => {
  it('keeps the current organization on the session and switches only to organizations the user belongs to', async () => {
    const a = await newOrganization(w);
    const b = await newOrganization(w);
    const session = () => w.db.selectFrom('sessions').select('current_organization_id').where('id_hash', '=', sha256Hex(w.browsers.owner.cookies.get('orgauth_session') ?? '')).executeTakeFirstOrThrow();
    expect((await session()).current_organization_id).toBe(b.id);
    const res = await selectOrganization(w.browsers.owner, a.id);
    expect(res.statusCode).toBe(303);
    expect(res.headers.location).toBe('/dashboard');
    expect((await session()).current_organization_id).toBe(a.id);
    const page = await w.browsers.owner.get('/dashboard');
    expect(page.body).toMatch(new RegExp(`<option value="${a.id}" selected>`));

    const outsider = await selectOrganization(w.browsers.outsider, a.id);
    expect(outsider.statusCode).toBe(403);
    expectPageSecurityHeaders(outsider);
    const outsiderOrg = await w.db.selectFrom('sessions').select('current_organization_id').where('user_id', '=', w.users.outsider.id).executeTakeFirstOrThrow();
    expect(outsiderOrg.current_organization_id).not.toBe(a.id);
    // No CSRF token, or another session's: 403 and no switch.
    expect((await w.browsers.owner.post('/dashboard/organization', { organization_id: String(b.id) })).statusCode).toBe(403);
    const foreign = await w.browsers.admin.csrf('/dashboard');
    expect((await w.browsers.owner.post('/dashboard/organization', { organization_id: String(b.id), csrf_token: foreign })).statusCode).toBe(403);
    expect((await session()).current_organization_id).toBe(a.id);
  });

  it('falls back to another organization when the user is removed from the current one', async () => {
    await newOrganization(w, { select: false });
    const a = await newOrganization(w);
    const before = await w.browsers.member.get('/dashboard');
    expect(before.body).toContain(`<option value="${a.id}"`);
    await w.db.deleteFrom('memberships').where('organization_id', '=', a.id).where('user_id', '=', w.users.member.id).execute();
    const page = await w.browsers.member.get('/dashboard/members');
    expect(page.statusCode).toBe(200);
    expect(page.body).not.toContain(`<option value="${a.id}"`);
    const session = await w.db.selectFrom('sessions').select('current_organization_id').where('user_id', '=', w.users.member.id).execute();
    expect(session.map((s) => s.current_organization_id)).not.toContain(a.id);
  });
});

describe(`dashboard connected apps on ${BACKEND}`, () => {
  it('lists every live grant of the current organization with who authorized it', async () => {
    const org = await newOrganization(w);
    const other = await newOrganization(w, { select: false });
    await userGrant(w, org, w.users.member.id, ['contacts.read']);
    await submit(w.browsers.owner, `/dashboard/applications/${org.privateApp.client_id}/token`, { scopes: ['tasks.read'] });
    const hidden = await userGrant(w, other, w.users.owner.id, ['tasks.read']);
    const page = await w.browsers.member.get('/dashboard/connected-apps');
    expect(page.statusCode).toBe(200);
    expectPageSecurityHeaders(page);
    expect(page.body).toContain(w.users.member.email);
    expect(page.body).toContain('the application itself');
    expect(page.body).not.toContain(`/dashboard/connected-apps/${hidden}/revoke`);
    // A member sees Revoke only on their own grant.
    expect(page.body.match(/>Revoke…<\/button>/g)).toHaveLength(1);
    const admin = await w.browsers.admin.get('/dashboard/connected-apps');
    expect(admin.body.match(/>Revoke…<\/button>/g)).toHaveLength(2);
  });

  it('revokes a grant: its token gets 401 from the API at once', async () => {
    const org = await newOrganization(w);
    const token = accessTokenIn((await submit(w.browsers.owner, `/dashboard/applications/${org.privateApp.client_id}/token`, { scopes: ['contacts.read'] })).body) ?? '';
    expect((await listContacts(w.app, org.id, token)).statusCode).toBe(200);
    const grant = await w.db.selectFrom('grants').select('id').where('organization_id', '=', org.id).executeTakeFirstOrThrow();
    // The list's button asks first; nothing is revoked until the confirmation page's form is sent.
    const ask = await submit(w.browsers.admin, `/dashboard/connected-apps/${grant.id}/revoke`);
    expect(ask.statusCode).toBe(200);
    expect((await listContacts(w.app, org.id, token)).statusCode).toBe(200);
    const res = await submit(w.browsers.admin, `/dashboard/connected-apps/${grant.id}/revoke`, { confirm: 'revoke' });
    expect(res.statusCode).toBe(303);
    expect(res.headers.location).toBe('/dashboard/connected-apps');
    expect((await listContacts(w.app, org.id, token)).statusCode).toBe(401);
    expect(await grantRow(w, grant.id)).toMatchObject({ revoked_reason: 'revoked_by_user' });
    const event = await w.db.selectFrom('audit_events').select(['actor_user_id', 'action']).where('organization_id', '=', org.id).where('action', '=', 'grant.revoked').executeTakeFirstOrThrow();
    expect(event.actor_user_id).toBe(w.users.admin.id);
  });

  it('lets a member revoke their own grant but not another user’s (403); an outsider gets 404', async () => {
    const org = await newOrganization(w);
    const mine = await userGrant(w, org, w.users.member.id, ['contacts.read']);
    const theirs = await userGrant(w, org, w.users.owner.id, ['contacts.read']);
    for (const fields of [{}, { confirm: 'revoke' }] as Record<string, string>[]) {
      expect((await submit(w.browsers.member, `/dashboard/connected-apps/${theirs}/revoke`, fields)).statusCode).toBe(403);
      expect((await submit(w.browsers.outsider, `/dashboard/connected-apps/${theirs}/revoke`, fields)).statusCode).toBe(404);
    }
    expect((await grantRow(w, theirs)).revoked_at).toBeNull();
    expect((await submit(w.browsers.member, `/dashboard/connected-apps/${mine}/revoke`, { confirm: 'revoke' })).statusCode).toBe(303);
    expect((await grantRow(w, mine)).revoked_at).not.toBeNull();
  });

  it('refuses a revoke without the CSRF token, or of another organization’s grant by id (404)', async () => {
    const b = await newOrganization(w);
    const a = await newOrganization(w); // current
    const grantA = await userGrant(w, a, w.users.owner.id, ['contacts.read']);
    const grantB = await userGrant(w, b, w.users.owner.id, ['contacts.read']);
    expect((await w.browsers.owner.post(`/dashboard/connected-apps/${grantA}/revoke`, {})).statusCode).toBe(403);
    const foreign = await w.browsers.admin.csrf('/dashboard');
    expect((await w.browsers.owner.post(`/dashboard/connected-apps/${grantA}/revoke`, { csrf_token: foreign })).statusCode).toBe(403);
    expect((await submit(w.browsers.owner, `/dashboard/connected-apps/${grantB}/revoke`)).statusCode).toBe(404);
    expect((await submit(w.browsers.owner, '/dashboard/connected-apps/01/revoke')).statusCode).toBe(404);
    expect((await grantRow(w, grantA)).revoked_at).toBeNull();
    expect((await grantRow(w, grantB)).revoked_at).toBeNull();
  });
});

describe(`dashboard lists on ${BACKEND}`, () => {
  it('show connected apps and members 100 a page, keyset links to the next page, nothing repeated or skipped', async () => {
    const org = await newOrganization(w);
    const application = await w.db.selectFrom('applications').select('id').where('client_id', '=', org.publicApp.client_id).executeTakeFirstOrThrow();
    await w.db
      .insertInto('grants')
      .values(Array.from({ length: 150 }, () => ({ organization_id: org.id, application_id: application.id, user_id: w.users.member.id, scopes: ['contacts.read'] })))
      .execute();
    const users = await w.db
      .insertInto('users')
      .values(Array.from({ length: 120 }, (_, i) => ({ email: `paged${i}-${process.pid}@example.com`, password_hash: '$argon2id$paged' })))
      .returning('id')
      .execute();
    await w.db.insertInto('memberships').values(users.map((u) => ({ organization_id: org.id, user_id: u.id, role: 'member' as const }))).execute();

    const walk = async (first: string, rowPattern: RegExp, nextPattern: RegExp) => {
      const ids: string[] = [];
      const pages: number[] = [];
      for (let url: string | undefined = first; url; ) {
        const res = await w.browsers.admin.get(url);
        expect(res.statusCode).toBe(200);
        const rows = [...res.body.matchAll(rowPattern)].map((m) => m[1]!);
        pages.push(rows.length);
        ids.push(...rows);
        url = nextPattern.exec(res.body)?.[1]?.replaceAll('&amp;', '&');
      }
      return { ids, pages };
    };
    const grants = await walk('/dashboard/connected-apps', /action="\/dashboard\/connected-apps\/(\d+)\/revoke"/g, /href="(\/dashboard\/connected-apps\?before=\d+)">Next page/);
    expect(grants.pages).toEqual([100, 50]);
    const live = await w.db.selectFrom('grants').select('id').where('organization_id', '=', org.id).where('revoked_at', 'is', null).orderBy('id', 'desc').execute();
    expect(grants.ids.map(Number)).toEqual(live.map((g) => g.id));

    const members = await walk('/dashboard/members', /<td data-label="Email">([^<]+)<\/td>/g, /href="(\/dashboard\/members\?after=\d+)">Next page/);
    expect(members.pages).toEqual([100, 23]);
    const memberRows = await w.db
      .selectFrom('memberships')
      .innerJoin('users', 'users.id', 'memberships.user_id')
      .select('users.email')
      .where('organization_id', '=', org.id)
      .orderBy('memberships.user_id')
      .execute();
    expect(members.ids).toEqual(memberRows.map((m) => m.email));
  });
});

describe(`dashboard members on ${BACKEND}`, () => {
  let n = 0;
  const newUser = async () => createUser(w.db, { email: `new${++n}-${process.pid}@example.com`, password: PASSWORD });

  it('lists members; only owners and admins get the forms', async () => {
    await newOrganization(w);
    const member = await w.browsers.member.get('/dashboard/members');
    expect(member.statusCode).toBe(200);
    expect(member.body).toContain(w.users.admin.email);
    expect(member.body).not.toMatch(/<form method="post" action="\/dashboard\/members/);
    const admin = await w.browsers.admin.get('/dashboard/members');
    expect(admin.body).toContain('>Add member</button>');
    expect(admin.body).toContain(`action="/dashboard/members/${w.users.member.id}/remove"`);
    // An admin gets no form for the owner, and cannot offer the owner role.
    expect(admin.body).not.toContain(`action="/dashboard/members/${w.users.owner.id}/`);
    expect(admin.body).not.toContain('<option value="owner"');
  });

  it('adds an existing user by email with a role, and says so when there is no such user', async () => {
    const org = await newOrganization(w);
    const user = await newUser();
    const res = await submit(w.browsers.admin, '/dashboard/members', { email: user.email.toUpperCase(), role: 'admin' });
    expect(res.statusCode).toBe(303);
    expect(await role(org.id, user.id)).toBe('admin');
    const again = await submit(w.browsers.admin, '/dashboard/members', { email: user.email, role: 'member' });
    expect(again.statusCode).toBe(400);
    expect(again.body).toContain('already a member');
    const unknown = await submit(w.browsers.admin, '/dashboard/members', { email: 'nobody@example.com', role: 'member' });
    expect(unknown.statusCode).toBe(400);
    expect(unknown.body).toContain('no account with this email');
    const events = await w.db.selectFrom('audit_events').select(['action', 'actor_user_id']).where('organization_id', '=', org.id).where('action', '=', 'member.added').execute();
    expect(events).toContainEqual({ action: 'member.added', actor_user_id: w.users.admin.id });
  });

  it('refuses members (403), and admins adding an owner (403)', async () => {
    const org = await newOrganization(w);
    const user = await newUser();
    expect((await submit(w.browsers.member, '/dashboard/members', { email: user.email, role: 'member' })).statusCode).toBe(403);
    expect((await submit(w.browsers.admin, '/dashboard/members', { email: user.email, role: 'owner' })).statusCode).toBe(403);
    expect(await role(org.id, user.id)).toBeUndefined();
    expect((await submit(w.browsers.owner, '/dashboard/members', { email: user.email, role: 'owner' })).statusCode).toBe(303);
    expect(await role(org.id, user.id)).toBe('owner');
  });

  it('changes a role; an admin may not change an owner, a member nothing; the last owner cannot be demoted', async () => {
    const org = await newOrganization(w);
    expect((await submit(w.browsers.member, `/dashboard/members/${w.users.admin.id}/role`, { role: 'member' })).statusCode).toBe(403);
    expect((await submit(w.browsers.admin, `/dashboard/members/${w.users.owner.id}/role`, { role: 'member' })).statusCode).toBe(403);
    expect((await submit(w.browsers.admin, `/dashboard/members/${w.users.member.id}/role`, { role: 'owner' })).statusCode).toBe(403);
    const last = await submit(w.browsers.owner, `/dashboard/members/${w.users.owner.id}/role`, { role: 'admin' });
    expect(last.statusCode).toBe(409);
    expect(last.body).toContain('last owner');
    expect(await role(org.id, w.users.owner.id)).toBe('owner');
    expect((await submit(w.browsers.admin, `/dashboard/members/${w.users.member.id}/role`, { role: 'admin' })).statusCode).toBe(303);
    expect(await role(org.id, w.users.member.id)).toBe('admin');
    const event = await w.db.selectFrom('audit_events').select('details').where('organization_id', '=', org.id).where('action', '=', 'member.role_changed').executeTakeFirstOrThrow();
    expect(event.details).toEqual({ user_id: w.users.member.id, from: 'member', to: 'admin' });
    // With a second owner, the first may step down.
    expect((await submit(w.browsers.owner, `/dashboard/members/${w.users.admin.id}/role`, { role: 'owner' })).statusCode).toBe(303);
    expect((await submit(w.browsers.owner, `/dashboard/members/${w.users.owner.id}/role`, { role: 'admin' })).statusCode).toBe(303);
    expect(await role(org.id, w.users.owner.id)).toBe('admin');
  });

  it('removes a member and revokes the grants they gave here; the last owner cannot be removed', async () => {
    const org = await newOrganization(w);
    const grant = await userGrant(w, org, w.users.member.id, ['contacts.read']);
    expect((await submit(w.browsers.member, `/dashboard/members/${w.users.admin.id}/remove`)).statusCode).toBe(403);
    expect((await submit(w.browsers.admin, `/dashboard/members/${w.users.owner.id}/remove`)).statusCode).toBe(403);
    expect((await submit(w.browsers.owner, `/dashboard/members/${w.users.owner.id}/remove`)).statusCode).toBe(409);
    expect(await role(org.id, w.users.owner.id)).toBe('owner');
    expect((await submit(w.browsers.owner, `/dashboard/members/${w.users.owner.id}/remove`, { confirm: 'remove' })).statusCode).toBe(409);
    const ask = await submit(w.browsers.admin, `/dashboard/members/${w.users.member.id}/remove`);
    expect(ask.statusCode).toBe(200);
    expect(await role(org.id, w.users.member.id)).toBe('member');
    const res = await submit(w.browsers.admin, `/dashboard/members/${w.users.member.id}/remove`, { confirm: 'remove' });
    expect(res.statusCode).toBe(303);
    expect(await role(org.id, w.users.member.id)).toBeUndefined();
    // Revoked by the job the removal queued.
    await finishJobs(w.db);
    expect(await grantRow(w, grant)).toMatchObject({ revoked_reason: 'member_removed' });
  });

  it('refuses member actions without CSRF (403), and on another organization’s member by id (404)', async () => {
    const b = await newOrganization(w);
    const bOnly = await newUser();
    await addMember(w.db, { organizationId: b.id, userId: bOnly.id, role: 'member' });
    const a = await newOrganization(w); // current
    const user = await newUser();
    for (const [url, fields] of [
      ['/dashboard/members', { email: user.email, role: 'member' }],
      [`/dashboard/members/${w.users.member.id}/role`, { role: 'admin' }],
      [`/dashboard/members/${w.users.member.id}/remove`, {}],
      [`/dashboard/members/${w.users.member.id}/remove`, { confirm: 'remove' }],
    ] as const) {
      expect((await w.browsers.owner.post(url, fields)).statusCode, url).toBe(403);
      const foreign = await w.browsers.admin.csrf('/dashboard');
      expect((await w.browsers.owner.post(url, { ...fields, csrf_token: foreign })).statusCode, url).toBe(403);
    }
    expect(await role(a.id, user.id)).toBeUndefined();
    expect(await role(a.id, w.users.member.id)).toBe('member');
    expect((await submit(w.browsers.owner, `/dashboard/members/${bOnly.id}/remove`)).statusCode).toBe(404);
    expect((await submit(w.browsers.owner, `/dashboard/members/${bOnly.id}/remove`, { confirm: 'remove' })).statusCode).toBe(404);
    expect((await submit(w.browsers.owner, `/dashboard/members/${bOnly.id}/role`, { role: 'admin' })).statusCode).toBe(404);
    expect((await submit(w.browsers.outsider, `/dashboard/members/${w.users.member.id}/remove`)).statusCode).toBe(404);
    expect(await role(b.id, bOnly.id)).toBe('member');
  });
});

describe(`dashboard audit log on ${BACKEND}`, () => {
  it('shows the current organization’s events newest first, 50 a page, keyset on id', async () => {
    const org = await newOrganization(w);
    const other = await newOrganization(w, { select: false });
    for (let i = 0; i < 60; i++) await recordAuditEvent(w.db, { organizationId: org.id, action: `test.event_${i}` });
    await recordAuditEvent(w.db, { organizationId: other.id, action: 'test.elsewhere' });
    const first = await w.browsers.member.get('/dashboard/audit');
    expect(first.statusCode).toBe(200);
    expectPageSecurityHeaders(first);
    expect(first.body).not.toContain('test.elsewhere');
    const actions = [...first.body.matchAll(/<td data-label="Action"><code>([^<]+)<\/code><\/td>/g)].map((m) => m[1]);
    expect(actions).toHaveLength(50);
    expect(actions.slice(0, 2)).toEqual(['test.event_59', 'test.event_58']);
    const next = /href="\/dashboard\/audit\?before=(\d+)"/.exec(first.body)?.[1];
    expect(next).toBeDefined();
    const second = await w.browsers.member.get(`/dashboard/audit?before=${next}`);
    const rest = [...second.body.matchAll(/<td data-label="Action"><code>([^<]+)<\/code><\/td>/g)].map((m) => m[1]);
    expect(rest[0]).toBe('test.event_9');
    expect(rest).toContain('organization.created');
    expect(second.body).not.toContain('?before=');
  });
});

describe(`dashboard account on ${BACKEND}`, () => {
  it('changes the password with the current one, signs out the other sessions and audits it', async () => {
    const user = await createUser(w.db, { email: `pw-${process.pid}@example.com`, password: PASSWORD });
    const org = await newOrganization(w, { select: false });
    await addMember(w.db, { organizationId: org.id, userId: user.id, role: 'member' });
    const b = new Browser(w.app, '10.30.0.1');
    const other = new Browser(w.app, '10.30.0.2');
    await b.login(user.email, PASSWORD);
    await other.login(user.email, PASSWORD);
    const wrong = await submit(b, '/dashboard/account/password', { current_password: 'not-the-password', new_password: 'a-brand-new-password' });
    expect(wrong.statusCode).toBe(400);
    expect(wrong.body).toContain('current password is not correct');
    const short = await submit(b, '/dashboard/account/password', { current_password: PASSWORD, new_password: 'short' });
    expect(short.statusCode).toBe(400);
    expect((await b.post('/dashboard/account/password', { current_password: PASSWORD, new_password: 'a-brand-new-password' })).statusCode).toBe(403);
    const ok = await submit(b, '/dashboard/account/password', { current_password: PASSWORD, new_password: 'a-brand-new-password' });
    expect(ok.statusCode).toBe(200);
    const row = await w.db.selectFrom('users').select('password_hash').where('id', '=', user.id).executeTakeFirstOrThrow();
    expect(row.password_hash).toMatch(/^\$argon2id\$/);
    expect((await other.get('/dashboard')).statusCode).toBe(303);
    expect((await b.get('/dashboard')).statusCode).toBe(200);
    expect((await new Browser(w.app, '10.30.0.3').login(user.email, PASSWORD)).statusCode).toBe(400);
    expect((await new Browser(w.app, '10.30.0.4').login(user.email, 'a-brand-new-password')).statusCode).toBe(303);
    const events = await w.db.selectFrom('audit_events').select('action').where('organization_id', '=', org.id).where('actor_user_id', '=', user.id).execute();
    expect(events).toEqual([{ action: 'user.password_changed' }]);
  });

  it("lists the user's browser sessions (browser, address, signed in, last seen) and signs out one of them, or all the others", async () => {
    const user = await createUser(w.db, { email: `list-${process.pid}@example.com`, password: PASSWORD });
    const b = new Browser(w.app, '10.30.0.7', 'Chromium/156 (this one)');
    const other = new Browser(w.app, '10.30.0.8', 'Firefox/128 <script>alert(1)</script>');
    const third = new Browser(w.app, '10.30.0.9', 'Safari/18');
    for (const browser of [b, other, third]) expect((await browser.login(user.email, PASSWORD)).statusCode).toBe(303);
    const page = await b.get('/dashboard/account');
    expect(page.statusCode).toBe(200);
    expect(page.body).toContain('Chromium/156 (this one) <strong>(this browser)</strong>');
    expect(page.body).toContain('Firefox/128 &lt;script&gt;alert(1)&lt;/script&gt;');
    expect(page.body).not.toContain('<script>alert(1)');
    for (const ip of ['10.30.0.7', '10.30.0.8', '10.30.0.9']) expect(page.body).toContain(`<td data-label="IP address">${ip}</td>`);
    const idOf = async (ip: string) => (await w.db.selectFrom('sessions').select('id').where('user_id', '=', user.id).where('ip', '=', ip).executeTakeFirstOrThrow()).id;

    // One other session: it stops working, the rest go on.
    expect((await b.post(`/dashboard/account/sessions/${await idOf('10.30.0.8')}/sign-out`, {})).statusCode).toBe(403);
    const one = await submit(b, `/dashboard/account/sessions/${await idOf('10.30.0.8')}/sign-out`);
    expect(one.statusCode).toBe(200);
    expect(one.body).not.toContain('Firefox/128');
    expect((await other.get('/dashboard')).statusCode).toBe(303);
    expect((await third.get('/dashboard')).statusCode).toBe(200);
    // Someone else's session, a gone one or a malformed number: "no such session", and nothing ends.
    const outsiderSession = await w.db.selectFrom('sessions').select('id').where('user_id', '=', w.users.outsider.id).executeTakeFirstOrThrow();
    for (const id of [String(outsiderSession.id), String(await idOf('10.30.0.7') + 100_000), '01', '-1', 'abc']) {
      expect((await submit(b, `/dashboard/account/sessions/${id}/sign-out`)).statusCode, id).toBe(404);
    }
    expect((await w.browsers.outsider.get('/dashboard')).statusCode).toBe(200);

    // Everywhere else: this browser stays.
    const others = await submit(b, '/dashboard/account/sessions/others');
    expect(others.statusCode).toBe(200);
    expect(others.body).toContain('One other session was signed out.');
    expect((await third.get('/dashboard')).statusCode).toBe(303);
    expect((await b.get('/dashboard')).statusCode).toBe(200);

    // This browser's own row signs it out.
    const own = await submit(b, `/dashboard/account/sessions/${await idOf('10.30.0.7')}/sign-out`);
    expect(own.statusCode).toBe(303);
    expect(own.headers.location).toBe('/login');
    expect((await b.get('/dashboard')).statusCode).toBe(303);
    expect(await w.db.selectFrom('sessions').select('id').where('user_id', '=', user.id).execute()).toEqual([]);
  });

  it('records when a session was last seen, writing it at most once a minute', async () => {
    const user = await createUser(w.db, { email: `seen-${process.pid}@example.com`, password: PASSWORD });
    const b = new Browser(w.app, '10.30.0.10');
    await b.login(user.email, PASSWORD);
    const lastSeen = async () => (await w.db.selectFrom('sessions').select('last_seen_at').where('user_id', '=', user.id).executeTakeFirstOrThrow()).last_seen_at.getTime();
    const setLastSeen = (msAgo: number) => w.db.updateTable('sessions').set({ last_seen_at: new Date(Date.now() - msAgo) }).where('user_id', '=', user.id).execute();
    await setLastSeen(120_000);
    const before = await lastSeen();
    expect((await b.get('/dashboard')).statusCode).toBe(200);
    expect(await lastSeen()).toBeGreaterThan(before + 100_000);
    await setLastSeen(30_000);
    const recent = await lastSeen();
    expect((await b.get('/dashboard')).statusCode).toBe(200);
    expect(await lastSeen()).toBe(recent);
  });

  it('signs out of every session, only with the CSRF token', async () => {
    const user = await createUser(w.db, { email: `all-${process.pid}@example.com`, password: PASSWORD });
    const b = new Browser(w.app, '10.30.0.5');
    const other = new Browser(w.app, '10.30.0.6');
    await b.login(user.email, PASSWORD);
    await other.login(user.email, PASSWORD);
    expect((await b.post('/dashboard/account/sessions', {})).statusCode).toBe(403);
    const res = await submit(b, '/dashboard/account/sessions');
    expect(res.statusCode).toBe(303);
    expect(res.headers.location).toBe('/login');
    expect(await w.db.selectFrom('sessions').select('id_hash').where('user_id', '=', user.id).execute()).toEqual([]);
    expect((await other.get('/dashboard')).statusCode).toBe(303);
    expect((await b.get('/dashboard/account')).statusCode).toBe(303);
  });

  it('a user in no organization sees the pages but can act on nothing there', async () => {
    const user = await createUser(w.db, { email: `lonely-${process.pid}@example.com`, password: PASSWORD });
    const b = new Browser(w.app, '10.30.0.7');
    await b.login(user.email, PASSWORD);
    for (const url of ['/dashboard', '/dashboard/applications', '/dashboard/connected-apps', '/dashboard/members', '/dashboard/audit', '/dashboard/account']) {
      const res = await b.get(url);
      expect(res.statusCode, url).toBe(200);
      expectPageSecurityHeaders(res);
    }
    expect((await submit(b, '/dashboard/applications', { type: 'private', name: 'x', scopes: ['tasks.read'] })).statusCode).toBe(403);
  });
});
