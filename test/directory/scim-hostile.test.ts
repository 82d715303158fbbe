/**
 * The SCIM service (issue 43) against what nobody here wrote and what nobody friendly sends.
 *
 * - A schema oracle: every User and Group the service answers with (POST, GET, PUT, PATCH, lists)
 *   is coerced by scimmy's RFC 7643 definitions (core User with the enterprise extension, Group)
 *   in the outbound direction, which throws on a missing required attribute, a wrong type, a
 *   single value where a collection belongs or a non-canonical value; and realistic Okta and
 *   Entra ID PATCH bodies applied by the npm package scim-patch and by the service to the same
 *   User must give the same resource.
 * - Hostile input: other directories' ids, tokens and domains, oversized and deeply nested
 *   bodies, bad filters, bodies that are not JSON objects, bad PATCH requests and paging: a SCIM
 *   error with the right status, never a 5xx.
 * - Races: two PATCHes with one If-Match, twenty creates of one userName or one address.
 * - A rotated token is refused at once.
 *
 * Every response goes through `checked`: below 500, a SCIM error body when 400 or more, and a
 * resource body through the oracle when it is a User or Group.
 */
import type { FastifyInstance, LightMyRequestResponse } from 'fastify';
import { scimPatch, type ScimPatchOperation, type ScimResource } from 'scim-patch';
import SCIMMY from 'scimmy';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createDirectory, rotateDirectoryToken, updateDirectory } from '../../src/directory/directories.js';
import { buildTestApp } from '../helpers/app.js';
import { BACKEND, createTestDatabase } from '../helpers/db.js';
import { createOrgFixture, type OrgFixture } from '../helpers/oauth.js';
import { ENTERPRISE, ERROR, GROUP, LIST, PATCH_OP, USER } from '../helpers/scim.js';


let t: Awaited<ReturnType<typeof createTestDatabase>>;
let app: FastifyInstance;
let org: OrgFixture;
let other: OrgFixture;
const db = () => t.handle.db;

interface Directory {
  id: number;
  token: string;
}

/** The organization's directory most tests use, a second one of the same organization, and one of another organization. */
let main: Directory;
let sibling: Directory;
let foreign: Directory;

async function domain(organizationId: number, name: string, state: 'verified' | 'pending' = 'verified'): Promise<void> {
  await db().insertInto('sso_domains').values({ organization_id: organizationId, domain: name, state, verification_token: `token-${name}`, verified_at: state === 'verified' ? new Date() : null }).execute();
}

async function newDirectory(organizationId: number, name: string): Promise<Directory> {
  const { directory, token } = await createDirectory(db(), organizationId, { name, default_role: 'member' });
  return { id: directory.id, token };
}

beforeAll(async () => {
  t = await createTestDatabase();
  app = await buildTestApp(db(), { env: { JOB_WORKERS: '0' } });
  org = await createOrgFixture(db());
  other = await createOrgFixture(db());
  await domain(org.organizationId, 'acme.example');
  await domain(org.organizationId, 'initech.example', 'pending');
  await domain(other.organizationId, 'globex.example');
  main = await newDirectory(org.organizationId, 'Okta');
  sibling = await newDirectory(org.organizationId, 'Entra');
  foreign = await newDirectory(other.organizationId, 'Globex IdP');
});
afterAll(async () => {
  await app?.close();
  await t?.close();
});

// ---------------------------------------------------------------------------------------------
// The oracle: scimmy's RFC 7643 definitions

const SHADOWED = new Set(['schemas', 'id', 'externalId', 'meta']);
/** Core User with the enterprise extension (optional), built anew: scimmy's own User definition is shared with the service's /Schemas and stays as it is. */
const USER_DEFINITION = new SCIMMY.Types.SchemaDefinition(
  'User',
  USER,
  'User Account',
  SCIMMY.Schemas.User.definition.attributes.filter((a) => !SHADOWED.has(a.name)),
).extend(SCIMMY.Schemas.EnterpriseUser.definition, false);
const GROUP_DEFINITION = SCIMMY.Schemas.Group.definition;

/** Removes what scimmy's coercion leaves out of a value that conforms: attributes of no schema (the service keeps what clients send). */
function known(definition: SCIMMY.Types.SchemaDefinition, body: Record<string, unknown>): Record<string, unknown> {
  const names = new Set(definition.attributes.map((a) => (a instanceof SCIMMY.Types.SchemaDefinition ? a.id : a.name).toLowerCase()));
  return Object.fromEntries(Object.entries(body).filter(([key]) => names.has(key.toLowerCase())));
}

/**
 * Throws unless `body` is a User (or Group) as RFC 7643 defines one, for a response: scimmy's
 * coercion throws on what does not conform, and what it gives back must be the body itself
 * (nothing renamed, recast or dropped but attributes of no schema).
 */
function conforms(kind: 'User' | 'Group', body: Record<string, unknown>): void {
  const definition = kind === 'User' ? USER_DEFINITION : GROUP_DEFINITION;
  const coerced = JSON.parse(JSON.stringify(definition.coerce(body, 'out'))) as Record<string, unknown>;
  expect(coerced).toEqual(known(definition, body));
}

function conformsAll(body: Record<string, unknown>): void {
  const schemas = body.schemas as string[];
  if (schemas.includes(LIST)) {
    for (const resource of body.Resources as Record<string, unknown>[]) conformsAll(resource);
  } else if (schemas.includes(USER)) {
    conforms('User', body);
  } else if (schemas.includes(GROUP)) {
    conforms('Group', body);
  }
}

// ---------------------------------------------------------------------------------------------
// Requests

/** Every response: never a 5xx, a SCIM error when refused, a User or Group that conforms when one is sent (unless `attributes` picked some). */
function checked(res: LightMyRequestResponse, url: string): LightMyRequestResponse {
  expect(res.statusCode, `${url}: ${res.body.slice(0, 300)}`).toBeLessThan(500);
  if (res.statusCode >= 400) {
    expect(res.json(), url).toMatchObject({ schemas: [ERROR], status: String(res.statusCode) });
  } else if (res.body !== '' && /\/(Users|Groups)/.test(url) && !/[?&]attributes=/.test(url)) {
    conformsAll(res.json());
  }
  return res;
}

type Method = 'GET' | 'POST' | 'PUT' | 'PATCH' | 'DELETE';

/** A SCIM request as the IdP sends it: its bearer token, application/scim+json. */
async function scim(directory: Directory, method: Method, path: string, body?: unknown, headers: Record<string, string> = {}): Promise<LightMyRequestResponse> {
  return raw(directory, method, path, body === undefined ? undefined : JSON.stringify(body), headers);
}

/** A request with the payload as given (`content-type` application/scim+json unless the headers say otherwise). */
async function raw(directory: Directory, method: Method, path: string, payload: string | undefined, headers: Record<string, string> = {}): Promise<LightMyRequestResponse> {
  const url = `/scim/v2/${directory.id}${path}`;
  const res = await app.inject({
    method,
    url,
    headers: { authorization: `Bearer ${directory.token}`, ...(payload === undefined ? {} : { 'content-type': 'application/scim+json' }), ...headers },
    ...(payload === undefined ? {} : { payload }),
  });
  return checked(res, url);
}

function ok(res: LightMyRequestResponse, status: number) {
  expect(res.statusCode, res.body.slice(0, 500)).toBe(status);
  return res.body === '' ? undefined : res.json();
}

function scimError(res: LightMyRequestResponse, status: number, scimType?: string) {
  expect(res.statusCode, res.body.slice(0, 500)).toBe(status);
  const body = res.json();
  expect(body).toMatchObject({ schemas: [ERROR], status: String(status), ...(scimType ? { scimType } : {}) });
  expect(res.headers['content-type']).toMatch(/^application\/scim\+json/);
  return body;
}

let n = 0;
const unique = (prefix: string) => `${prefix}${++n}`;

/** A User as Okta or Entra ID creates one, every attribute RFC 7643 §4.1 and the enterprise extension name filled in. */
function richUser(local: string, domainName = 'acme.example'): Record<string, unknown> {
  return {
    schemas: [USER, ENTERPRISE],
    userName: `${local}@${domainName}`,
    externalId: `ext-${local}`,
    name: { formatted: 'Ms. Barbara J Jensen III', familyName: 'Jensen', givenName: 'Barbara', middleName: 'Jane', honorificPrefix: 'Ms.', honorificSuffix: 'III' },
    displayName: 'Babs Jensen',
    nickName: 'Babs',
    profileUrl: 'https://login.example.com/bjensen',
    title: 'Tour Guide',
    userType: 'Employee',
    preferredLanguage: 'en-US',
    locale: 'en-US',
    timezone: 'America/Los_Angeles',
    active: true,
    emails: [
      { value: `${local}@${domainName}`, type: 'work', primary: true },
      { value: `${local}@home.example.org`, type: 'home' },
    ],
    phoneNumbers: [{ value: '555-555-5555', type: 'work' }, { value: '555-555-4444', type: 'mobile' }],
    ims: [{ value: 'someaimhandle', type: 'aim' }],
    photos: [{ value: 'https://photos.example.com/profilephoto/72930000000Ccne/F', type: 'photo' }],
    addresses: [{ type: 'work', streetAddress: '100 Universal City Plaza', locality: 'Hollywood', region: 'CA', postalCode: '91608', country: 'US', formatted: '100 Universal City Plaza\nHollywood, CA 91608 USA', primary: true }],
    entitlements: [{ value: 'premium' }],
    roles: [{ value: 'tour-guide', display: 'Tour guide', primary: false }],
    x509Certificates: [{ value: 'MIIDQzCCAqygAwIBAgICEAAwDQYJKoZIhvcNAQEFBQAwTjELMAkGA1UEBhMCVVMx' }],
    password: 't1meMa$heen',
    [ENTERPRISE]: { employeeNumber: '701984', costCenter: '4130', organization: 'Universal Studios', division: 'Theme Park', department: 'Tour Operations', manager: { value: '26118915-6090-4610-87e4-49d8ca9f808d', displayName: 'John Smith' } },
  };
}

const plainUser = (userName: string, extra: Record<string, unknown> = {}) => ({ schemas: [USER], userName, active: true, ...extra });

async function createdUser(directory: Directory, body: Record<string, unknown>): Promise<Record<string, unknown> & { id: string }> {
  return ok(await scim(directory, 'POST', '/Users', body), 201);
}

async function createdGroup(directory: Directory, displayName: string, members: string[] = []): Promise<Record<string, unknown> & { id: string }> {
  return ok(await scim(directory, 'POST', '/Groups', { schemas: [GROUP], displayName, members: members.map((value) => ({ value })) }), 201);
}

const accounts = async (email: string) => db().selectFrom('users').select('id').where((eb) => eb(eb.fn('lower', ['email']), '=', email.toLowerCase())).execute();
const directoryUsers = async (directory: Directory, userName: string) =>
  db().selectFrom('directory_users').select(['id', 'user_id']).where('directory_id', '=', directory.id).where((eb) => eb(eb.fn('lower', ['user_name']), '=', userName.toLowerCase())).execute();

const filterQuery = (filter: string) => `/Users?filter=${encodeURIComponent(filter)}`;

// ---------------------------------------------------------------------------------------------

describe(`SCIM on ${BACKEND}: a schema oracle nobody here wrote (scimmy, scim-patch)`, () => {
  it('the oracle refuses what RFC 7643 does not allow', () => {
    const good = { ...richUser('oracle'), id: '2819c223-7f76-453a-919d-413861904646', meta: { resourceType: 'User', created: '2024-05-13T04:42:34.000Z', lastModified: '2024-05-13T04:42:34.000Z', location: 'https://x.example/Users/1', version: 'W/"1"' } };
    delete (good as Record<string, unknown>).password;
    expect(() => conforms('User', good)).not.toThrow();
    const broken: Record<string, unknown>[] = [
      { ...good, userName: undefined },
      { ...good, id: undefined },
      { ...good, active: 'True' },
      { ...good, emails: { value: 'a@acme.example' } },
      { ...good, name: 'Barbara Jensen' },
      { ...good, meta: { ...good.meta, created: 'yesterday' } },
      { ...good, groups: [{ value: 'g', type: 'nested' }] },
      { ...good, [ENTERPRISE]: { manager: 'someone' } },
      { ...good, displayName: ['Babs'] },
    ];
    for (const body of broken) expect(() => conforms('User', body), JSON.stringify(body).slice(0, 200)).toThrow();
    // What coercion would silently rename or recast is a difference too.
    expect(() => conforms('User', { ...good, Active: true, active: undefined })).toThrow();
    const group = { schemas: [GROUP], id: 'g1', displayName: 'G', members: [{ value: 'u1', type: 'User' }], meta: { resourceType: 'Group', location: 'https://x.example/Groups/g1' } };
    expect(() => conforms('Group', group)).not.toThrow();
    expect(() => conforms('Group', { ...group, displayName: undefined })).toThrow();
    expect(() => conforms('Group', { ...group, members: [{ value: 'u1', type: 'Robot' }] })).toThrow();
  });

  it('every User and Group the service answers with conforms: POST, GET, PUT, PATCH, lists, .search', async () => {
    const user = await createdUser(main, richUser(unique('oracle')));
    expect(user).not.toHaveProperty('password');
    expect(user.schemas).toEqual([USER, ENTERPRISE]);
    const got = ok(await scim(main, 'GET', `/Users/${user.id}`), 200);
    const put = ok(await scim(main, 'PUT', `/Users/${user.id}`, { ...got, title: 'Senior Tour Guide', nickName: null }), 200);
    expect(put.title).toBe('Senior Tour Guide');
    const patched = ok(await scim(main, 'PATCH', `/Users/${user.id}`, { schemas: [PATCH_OP], Operations: [{ op: 'Replace', path: 'active', value: 'False' }, { op: 'Add', path: `${ENTERPRISE}:department`, value: 'Finance' }] }), 200);
    expect(patched).toMatchObject({ active: false, [ENTERPRISE]: { department: 'Finance' } });
    const minimal = await createdUser(main, plainUser(`${unique('minimal')}@acme.example`));

    const group = await createdGroup(main, unique('Oracle group '), [user.id, minimal.id]);
    expect(group.members).toHaveLength(2);
    ok(await scim(main, 'GET', `/Groups/${group.id}`), 200);
    ok(await scim(main, 'PUT', `/Groups/${group.id}`, { schemas: [GROUP], displayName: unique('Oracle group '), externalId: 'grp-1', members: [{ value: user.id }] }), 200);
    const groupPatched = ok(await scim(main, 'PATCH', `/Groups/${group.id}?excludedAttributes=externalId`, { schemas: [PATCH_OP], Operations: [{ op: 'add', path: 'members', value: [{ value: minimal.id }] }] }), 200);
    expect(groupPatched.members).toHaveLength(2);
    const withGroups = ok(await scim(main, 'GET', `/Users/${minimal.id}`), 200);
    expect(withGroups.groups).toEqual([expect.objectContaining({ value: group.id, type: 'direct' })]);

    const users = ok(await scim(main, 'GET', '/Users?count=50'), 200);
    expect(users.Resources.length).toBeGreaterThanOrEqual(2);
    ok(await scim(main, 'POST', '/Users/.search', { schemas: ['urn:ietf:params:scim:api:messages:2.0:SearchRequest'], filter: `userName eq "${user.userName}"` }), 200);
    const groups = ok(await scim(main, 'GET', '/Groups'), 200);
    expect(groups.Resources.length).toBeGreaterThanOrEqual(1);
  });

  describe('scim-patch and the service agree on the same PATCH of the same User', () => {
    const clientView = (resource: Record<string, unknown>) => {
      const { id: _id, meta: _meta, groups: _groups, schemas: _schemas, ...rest } = resource;
      return JSON.parse(JSON.stringify(rest)) as Record<string, unknown>;
    };
    const cases: Array<[string, (self: string) => ScimPatchOperation[]]> = [
      // developer.okta.com/docs/api/openapi/okta-scim/guides/scim-20: deactivation and a profile update, path-less.
      ['Okta: deactivate, path-less with the id echoed', (self) => [{ op: 'replace', value: { id: self, active: false } } as ScimPatchOperation]],
      // A whole complex value: a partial one (name: {givenName}) is merged by the service, as RFC
      // 7644 §3.5.2.3 says of a complex target, where scim-patch replaces it when there is no path.
      ['Okta: path-less replace of attributes', () => [
        { op: 'replace', value: { displayName: 'Barbara J.', title: 'Manager', name: { formatted: 'Barb Jensen', familyName: 'Jensen', givenName: 'Barb', middleName: 'J', honorificPrefix: 'Dr.', honorificSuffix: 'PhD' } } },
      ]],
      // learn.microsoft.com/entra/identity/app-provisioning/use-scim-to-provision-users-and-groups: "Update User [Multi-valued properties]" and "[Single-valued properties]".
      ['Entra: Replace emails[type eq "work"].value and name.familyName', (self) => [
        { op: 'Replace', path: 'emails[type eq "work"].value', value: `changed.${self.slice(0, 8)}@acme.example` },
        { op: 'Replace', path: 'name.familyName', value: 'updatedFamilyName' },
      ] as ScimPatchOperation[]],
      ['Entra: Add displayName, title, enterprise department and manager; Replace active (aadOptscim062020)', () => [
        { op: 'Add', path: 'displayName', value: 'Barbara Jensen-Smith' },
        { op: 'Add', path: 'title', value: 'Head of Tours' },
        { op: 'Add', path: `${ENTERPRISE}:department`, value: 'Marketing' },
        { op: 'Add', path: `${ENTERPRISE}:manager`, value: { value: '9b0ae2c2-7c5b-4c8c-8dd3-0bb7a2a0e0a4' } },
        { op: 'Replace', path: 'active', value: false },
      ] as ScimPatchOperation[]],
      ['remove by value filter and an attribute; add to a multi-valued attribute', () => [
        { op: 'remove', path: 'phoneNumbers[type eq "mobile"]' },
        { op: 'remove', path: 'nickName' },
        { op: 'add', path: 'emails', value: [{ value: 'second@acme.example', type: 'other' }] },
        { op: 'replace', path: 'addresses[type eq "work"].locality', value: 'Burbank' },
      ]],
      ['replace a complex attribute (merged) and a sub-attribute of the extension', () => [
        { op: 'replace', path: 'name', value: { givenName: 'B', middleName: 'J' } },
        { op: 'replace', path: `${ENTERPRISE}:costCenter`, value: '5000' },
        { op: 'remove', path: `${ENTERPRISE}:division` },
      ]],
    ];
    for (const [name, operations] of cases) {
      it(name, async () => {
        const created = await createdUser(main, richUser(unique('agree')));
        const before = ok(await scim(main, 'GET', `/Users/${created.id}`), 200);
        const ops = operations(created.id);
        const expected = scimPatch(JSON.parse(JSON.stringify(before)) as ScimResource, JSON.parse(JSON.stringify(ops)), { mutateDocument: false, treatMissingAsAdd: true }) as unknown as Record<string, unknown>;
        const actual = ok(await scim(main, 'PATCH', `/Users/${created.id}`, { schemas: [PATCH_OP], Operations: ops }), 200);
        expect(clientView(actual)).toEqual(clientView(expected));
        expect(clientView(ok(await scim(main, 'GET', `/Users/${created.id}`), 200))).toEqual(clientView(expected));
      });
    }
  });
});

describe(`SCIM on ${BACKEND}: hostile input, never a 5xx`, () => {
  it("cannot read or change another directory's users and groups, of its organization or another's", async () => {
    const theirs = await createdUser(sibling, plainUser(`${unique('sibling')}@acme.example`));
    const theirGroup = await createdGroup(sibling, 'Sibling group', [theirs.id]);
    const far = await createdUser(foreign, plainUser(`${unique('far')}@globex.example`));
    const farGroup = await createdGroup(foreign, 'Globex group', [far.id]);
    const mine = await createdUser(main, plainUser(`${unique('mine')}@acme.example`));
    const myGroup = await createdGroup(main, unique('Mine '));

    for (const [user, group] of [[theirs, theirGroup], [far, farGroup]] as const) {
      scimError(await scim(main, 'GET', `/Users/${user.id}`), 404);
      scimError(await scim(main, 'PUT', `/Users/${user.id}`, { ...plainUser(`${unique('taken')}@acme.example`), id: user.id }), 404);
      scimError(await scim(main, 'PATCH', `/Users/${user.id}`, { schemas: [PATCH_OP], Operations: [{ op: 'replace', value: { active: false } }] }), 404);
      scimError(await scim(main, 'DELETE', `/Users/${user.id}`), 404);
      scimError(await scim(main, 'GET', `/Groups/${group.id}`), 404);
      scimError(await scim(main, 'PUT', `/Groups/${group.id}`, { schemas: [GROUP], displayName: 'Taken', members: [] }), 404);
      scimError(await scim(main, 'PATCH', `/Groups/${group.id}`, { schemas: [PATCH_OP], Operations: [{ op: 'remove', path: 'members' }] }), 404);
      scimError(await scim(main, 'DELETE', `/Groups/${group.id}`), 404);
      // Nor make them members of its groups, nor find them by filter.
      scimError(await scim(main, 'PATCH', `/Groups/${myGroup.id}`, { schemas: [PATCH_OP], Operations: [{ op: 'add', path: 'members', value: [{ value: user.id }] }] }), 400, 'invalidValue');
      scimError(await scim(main, 'POST', '/Groups', { schemas: [GROUP], displayName: unique('Grab '), members: [{ value: mine.id }, { value: user.id }] }), 400, 'invalidValue');
      scimError(await scim(main, 'PUT', `/Groups/${myGroup.id}`, { schemas: [GROUP], displayName: myGroup.displayName, members: [{ value: user.id }] }), 400, 'invalidValue');
      expect(ok(await scim(main, 'GET', filterQuery(`id eq "${user.id}" or userName eq "${user.userName}"`)), 200).totalResults).toBe(0);
      expect(ok(await scim(main, 'GET', `/Groups?filter=${encodeURIComponent(`displayName eq "${group.displayName}"`)}`), 200).totalResults).toBe(0);
    }
    // Their owners still see them as they were.
    expect(ok(await scim(sibling, 'GET', `/Users/${theirs.id}`), 200)).toMatchObject({ active: true, userName: theirs.userName });
    expect(ok(await scim(sibling, 'GET', `/Groups/${theirGroup.id}`), 200).members).toEqual([expect.objectContaining({ value: theirs.id })]);
    expect(ok(await scim(foreign, 'GET', `/Users/${far.id}`), 200)).toMatchObject({ active: true });
    expect(ok(await scim(foreign, 'GET', `/Groups/${farGroup.id}`), 200).members).toEqual([expect.objectContaining({ value: far.id })]);
    expect(ok(await scim(main, 'GET', `/Groups/${myGroup.id}`), 200).members).toEqual([]);
    // Ids that are not ids: 404; a path the router cannot read (bad percent-encoding, an id
    // longer than a path parameter may be) is refused before any route, as a SCIM error too.
    for (const id of ['not-a-uuid', "1' or '1'='1", '%00', encodeURIComponent('../Groups'), '9'.repeat(90)]) {
      scimError(await scim(main, 'GET', `/Users/${id}`), 404);
      scimError(await scim(main, 'PATCH', `/Groups/${id}`, { schemas: [PATCH_OP], Operations: [{ op: 'remove', path: 'members' }] }), 404);
    }
    scimError(await scim(main, 'GET', '/Users/%E0%A4%A'), 400);
    scimError(await scim(main, 'DELETE', `/Users/${'9'.repeat(500)}`), 414);
  });

  it('refuses a missing, wrong or other directory\'s token, and a disabled directory, with 401 and WWW-Authenticate', async () => {
    const disabled = await newDirectory(org.organizationId, 'Disabled');
    ok(await scim(disabled, 'GET', '/Users'), 200);
    await updateDirectory(db(), org.organizationId, disabled.id, { state: 'disabled' });
    const refusals: Array<[string, Record<string, string>, number]> = [
      ['no token', { authorization: '' }, main.id],
      ['not a bearer', { authorization: `Basic ${Buffer.from(`x:${main.token}`).toString('base64')}` }, main.id],
      ['a wrong token', { authorization: `Bearer ${main.token.slice(0, -4)}AAAA` }, main.id],
      ['a token of no shape', { authorization: 'Bearer x'.padEnd(5000, 'x') }, main.id],
      ['the sibling directory\'s token', { authorization: `Bearer ${sibling.token}` }, main.id],
      ['another organization\'s token', { authorization: `Bearer ${foreign.token}` }, main.id],
      ['a disabled directory\'s own token', { authorization: `Bearer ${disabled.token}` }, disabled.id],
      ['a directory that does not exist', { authorization: `Bearer ${main.token}` }, 2_000_000_000],
    ];
    for (const [why, headers, id] of refusals) {
      for (const [method, path] of [['GET', '/Users'], ['POST', '/Users'], ['GET', '/ServiceProviderConfig'], ['DELETE', '/Groups/2819c223-7f76-453a-919d-413861904646']] as const) {
        const res = await raw({ id, token: '' }, method, path, method === 'POST' ? JSON.stringify(plainUser('intruder@acme.example')) : undefined, headers);
        expect({ why, path, status: res.statusCode }).toEqual({ why, path, status: 401 });
        expect(res.headers['www-authenticate'], why).toMatch(/^Bearer /);
      }
    }
    // A path that is not a directory id at all.
    const res = await app.inject({ method: 'GET', url: '/scim/v2/abc/Users', headers: { authorization: `Bearer ${main.token}` } });
    checked(res, '/scim/v2/abc/Users');
    expect(res.statusCode).toBe(401);
    expect(await accounts('intruder@acme.example')).toEqual([]);
  });

  it("refuses another organization's domain, an unverified domain and a consumer domain: 400 invalidValue, nothing created", async () => {
    const existing = await createdUser(foreign, plainUser(`${unique('existing')}@globex.example`));
    const addresses = [
      `${unique('new')}@globex.example`, // another organization's verified domain
      existing.userName as string, // another organization's person
      `${unique('new')}@initech.example`, // this organization's, pending verification
      `${unique('new')}@gmail.com`, // a consumer domain
      `${unique('new')}@sub.acme.example`, // a subdomain of a verified domain is not verified
      'no-address-at-all',
    ];
    for (const address of addresses) {
      scimError(await scim(main, 'POST', '/Users', plainUser(address)), 400, 'invalidValue');
      // userName in a verified domain, but the address the account would get is not.
      scimError(await scim(main, 'POST', '/Users', plainUser(`${unique('alias')}@acme.example`, { emails: [{ value: address, primary: true, type: 'work' }] })), 400, 'invalidValue');
      expect(await directoryUsers(main, address)).toEqual([]);
    }
    for (const address of addresses.filter((a) => a !== existing.userName)) expect(await accounts(address), address).toEqual([]);
    expect((await accounts(existing.userName as string)).length).toBe(1);
    expect(await db().selectFrom('memberships').select('user_id').where('organization_id', '=', org.organizationId).where('user_id', '=', (await accounts(existing.userName as string))[0]!.id).execute()).toEqual([]);

    // Moving an existing user's address out of the verified domains: refused, and the account keeps its address.
    const mine = await createdUser(main, plainUser(`${unique('mover')}@acme.example`));
    const target = `${unique('moved')}@globex.example`;
    scimError(await scim(main, 'PUT', `/Users/${mine.id}`, plainUser(target)), 400, 'invalidValue');
    scimError(await scim(main, 'PATCH', `/Users/${mine.id}`, { schemas: [PATCH_OP], Operations: [{ op: 'replace', path: 'emails[type eq "work"].value', value: target }] }), 400, 'invalidValue');
    scimError(await scim(main, 'PATCH', `/Users/${mine.id}`, { schemas: [PATCH_OP], Operations: [{ op: 'replace', path: 'userName', value: target }] }), 400, 'invalidValue');
    expect(await accounts(target)).toEqual([]);
    expect((await accounts(mine.userName as string)).length).toBe(1);
  });

  it('refuses bodies over 1 MiB (413) and deeply nested or oversized resources (400)', async () => {
    const huge = JSON.stringify({ ...plainUser(`${unique('huge')}@acme.example`), title: 'x'.repeat(1024 * 1024 + 10) });
    scimError(await raw(main, 'POST', '/Users', huge), 413);
    scimError(await raw(main, 'POST', '/Users', huge, { 'content-type': 'application/json' }), 413);
    const mine = await createdUser(main, plainUser(`${unique('nested')}@acme.example`));
    const group = await createdGroup(main, unique('Nested '), [mine.id]);
    scimError(await raw(main, 'PUT', `/Users/${mine.id}`, huge), 413);
    scimError(await raw(main, 'POST', '/Users/.search', JSON.stringify({ filter: `userName eq "${'x'.repeat(1024 * 1024)}"` })), 413);

    const nest = (depth: number) => `${'{"a":'.repeat(depth)}"x"${'}'.repeat(depth)}`;
    const nestArrays = (depth: number) => `${'['.repeat(depth)}${']'.repeat(depth)}`;
    for (const depth of [20, 5_000, 100_000]) {
      const body = `{"schemas":["${USER}"],"userName":"${unique('deep')}@acme.example","nickName":${nest(depth)}}`;
      expect((await raw(main, 'POST', '/Users', body)).statusCode).toBe(400);
      expect((await raw(main, 'POST', '/Users', `{"schemas":["${USER}"],"userName":"deep@acme.example","addresses":${nestArrays(depth)}}`)).statusCode).toBe(400);
      expect((await raw(main, 'PUT', `/Users/${mine.id}`, `{"schemas":["${USER}"],"userName":"${mine.userName}","x":${nestArrays(depth)}}`)).statusCode).toBe(400);
      expect((await raw(main, 'POST', '/Groups', `{"schemas":["${GROUP}"],"displayName":"Deep","members":[{"value":${nest(depth)}}]}`)).statusCode).toBe(400);
      const deepOps = `{"schemas":["${PATCH_OP}"],"Operations":[{"op":"add","path":"nickName","value":${nest(depth)}}]}`;
      expect((await raw(main, 'PATCH', `/Users/${mine.id}`, deepOps)).statusCode).toBe(400);
      const pathless = `{"schemas":["${PATCH_OP}"],"Operations":[{"op":"add","value":${nest(depth)}}]}`;
      expect((await raw(main, 'PATCH', `/Users/${mine.id}`, pathless)).statusCode).toBe(400);
      const members = `{"schemas":["${PATCH_OP}"],"Operations":[{"op":"add","path":"members","value":${nestArrays(depth)}}]}`;
      expect((await raw(main, 'PATCH', `/Groups/${group.id}`, members)).statusCode).toBe(400);
      for (const key of ['attributes', 'excludedAttributes', 'filter', 'count']) {
        expect((await raw(main, 'POST', '/Users/.search', `{"${key}":${nestArrays(depth)}}`)).statusCode).toBe(400);
      }
    }
    // Under 1 MiB, but larger than a stored resource may be.
    scimError(await scim(main, 'POST', '/Users', plainUser(`${unique('large')}@acme.example`, { title: 'x'.repeat(200_000) })), 400, 'invalidValue');
    scimError(await scim(main, 'PATCH', `/Users/${mine.id}`, { schemas: [PATCH_OP], Operations: [{ op: 'add', path: 'title', value: 'x'.repeat(200_000) }] }), 400, 'invalidValue');
    // Nothing of these was kept.
    expect(ok(await scim(main, 'GET', `/Users/${mine.id}`), 200)).not.toHaveProperty('title');
    expect(await accounts('deep@acme.example')).toEqual([]);
  });

  it('refuses bad filters with 400 invalidFilter; an injection-shaped valid filter matches nothing', async () => {
    const victim = await createdUser(main, plainUser(`${unique('victim')}@acme.example`));
    const invalid = [
      'userName eq "x" or 1=1',
      "userName eq 'x' or '1'='1'",
      'userName eq "x" or userName pr --',
      'userName eq "x"; drop table users',
      '(userName eq "x"',
      'userName eq "x")',
      '((userName eq "x") or (active eq true)',
      'userName eq "x',
      'userName eq x"',
      'emails[type eq "work"',
      'emails[type eq "work"]]',
      'emails[type eq "work" ].value eq "x" ]',
      'nosuchattribute eq "x"',
      'password eq "secret"',
      'urn:evil:schema:attr eq "x"',
      'meta.nope eq "x"',
      'name.nope eq "x"',
      'userName.value eq "x"',
      'users.email eq "x"',
      'userName eq',
      'userName xx "x"',
      'eq "x"',
      'userName eq "x" and',
      'active eq "maybe"',
      'meta.created gt "yesterday"',
      `userName eq "${'a'.repeat(2_100)}"`,
      `${'('.repeat(50)}userName eq "x"${')'.repeat(50)}`,
      `${'not ('.repeat(50)}userName eq "x"${')'.repeat(50)}`,
      Array.from({ length: 80 }, (_, i) => `userName eq "u${i}"`).join(' or '),
      `emails[${'emails['.repeat(20)}value eq "x"${']'.repeat(21)}`,
      'userName eq "\\u0000"',
      'userName eq "\u0000"',
      '\u0000',
      'userName eq "x" \u2028 or userName pr',
    ];
    for (const filter of invalid) {
      const res = await scim(main, 'GET', filterQuery(filter));
      expect({ filter, status: res.statusCode, scimType: res.json().scimType }).toEqual({ filter, status: 400, scimType: 'invalidFilter' });
      const search = await scim(main, 'POST', '/Users/.search', { schemas: ['urn:ietf:params:scim:api:messages:2.0:SearchRequest'], filter });
      expect({ filter, status: search.statusCode }).toEqual({ filter, status: 400 });
      const groups = await scim(main, 'GET', `/Groups?filter=${encodeURIComponent(filter)}`);
      expect({ filter, status: groups.statusCode }).toEqual({ filter, status: 400 });
    }
    // Valid filters whose strings look like SQL: they match nothing, and the tables are still there.
    const valid = [
      "userName eq \"x'; drop table users;--\"",
      `userName eq "${victim.userName}\\" or \\"1\\"=\\"1"`,
      'userName co "%"',
      'userName sw "_"',
      'userName eq "\\\\"',
      'emails[value co "\' or 1=1 --"].value pr',
      'displayName eq "x\\u0027 or 1=1"',
    ];
    for (const filter of valid) {
      expect({ filter, found: ok(await scim(main, 'GET', filterQuery(filter)), 200).totalResults }).toEqual({ filter, found: 0 });
    }
    // Odd but valid: answered, not refused with a 5xx.
    for (const filter of ['userName gt 1e99999', 'not userName eq "x"', 'active eq true and active eq false', 'meta.created gt "1970-01-01T00:00:00Z"', 'emails[type eq "work" and value co "@"].value pr', 'USERNAME EQ "X"']) {
      ok(await scim(main, 'GET', filterQuery(filter)), 200);
    }
    // The filter given twice, or as something else than a string.
    scimError(await scim(main, 'GET', `/Users?filter=${encodeURIComponent('active pr')}&filter=${encodeURIComponent('active pr')}`), 400, 'invalidFilter');
    scimError(await scim(main, 'POST', '/Users/.search', { filter: { userName: 'x' } }), 400);
    expect(ok(await scim(main, 'GET', filterQuery(`userName eq "${victim.userName}"`)), 200).totalResults).toBe(1);
    expect((await db().selectFrom('users').select('id').limit(1).execute()).length).toBe(1);
  });

  it('refuses what is not a JSON object, and content types that are not JSON', async () => {
    const mine = await createdUser(main, plainUser(`${unique('syntax')}@acme.example`));
    const syntax: Array<[Method, string]> = [['POST', '/Users'], ['PUT', `/Users/${mine.id}`], ['PATCH', `/Users/${mine.id}`], ['POST', '/Groups'], ['POST', '/Users/.search']];
    for (const [method, path] of syntax) {
      for (const body of ['not json', '{"userName":', '{"a":1}{"b":2}', '[]', `[${JSON.stringify(plainUser('array@acme.example'))}]`, '"a string"', '42', 'null', 'true', '\u0000']) {
        const res = await raw(main, method, path, body);
        expect({ method, path, body, status: res.statusCode, scimType: res.json().scimType }).toEqual({ method, path, body, status: 400, scimType: 'invalidSyntax' });
      }
      // Prototype poisoning.
      for (const body of ['{"__proto__":{"admin":true}}', '{"constructor":{"prototype":{"admin":true}}}']) {
        expect({ method, path, body, status: (await raw(main, method, path, body)).statusCode }).toEqual({ method, path, body, status: 400 });
      }
      // Not JSON at all: the body is never read.
      for (const type of ['text/plain', 'application/x-www-form-urlencoded', 'multipart/form-data; boundary=x', 'application/xml']) {
        const res = await raw(main, method, path, 'userName=form%40acme.example&active=true', { 'content-type': type });
        expect({ method, path, type, status: res.statusCode }).toEqual({ method, path, type, status: 415 });
      }
    }
    // Strings no database text can hold (U+0000; JSON.stringify writes it as \u0000), and a lone surrogate.
    for (const [method, path, body] of [
      ['POST', '/Users', plainUser('nul\u0000@acme.example')],
      ['POST', '/Users', plainUser(`${unique('nul')}@acme.example`, { title: 'a\u0000b' })],
      ['POST', '/Users', plainUser(`${unique('nul')}@acme.example`, { externalId: '\u0000' })],
      ['POST', '/Users', plainUser(`${unique('nul')}@acme.example`, { 'ti\u0000tle': 'x' })],
      ['PUT', `/Users/${mine.id}`, plainUser(mine.userName as string, { displayName: '\u0000' })],
      ['PATCH', `/Users/${mine.id}`, { schemas: [PATCH_OP], Operations: [{ op: 'add', path: 'nickName', value: '\u0000' }] }],
      ['POST', '/Groups', { schemas: [GROUP], displayName: 'nul\u0000' }],
      ['POST', '/Users', plainUser(`${unique('lone')}@acme.example`, { title: '\ud800' })],
    ] as const) {
      const res = await scim(main, method, path, body);
      expect({ method, path, body: JSON.stringify(body), status: res.statusCode }).toEqual({ method, path, body: JSON.stringify(body), status: 400 });
    }
    // A POST with no body at all.
    expect((await raw(main, 'POST', '/Users', undefined)).statusCode).toBe(400);
    expect(await accounts('array@acme.example')).toEqual([]);
    expect(await accounts('form@acme.example')).toEqual([]);
  });

  it('refuses bad PATCH requests: unknown op, bad path, no Operations', async () => {
    const mine = await createdUser(main, plainUser(`${unique('patch')}@acme.example`, { title: 'Keep' }));
    const group = await createdGroup(main, unique('Patched '), [mine.id]);
    const bad: Array<[unknown, string]> = [
      [{ schemas: [PATCH_OP] }, 'invalidSyntax'],
      [{ schemas: [PATCH_OP], Operations: null }, 'invalidSyntax'],
      [{ schemas: [PATCH_OP], Operations: 'replace' }, 'invalidSyntax'],
      [{ schemas: [PATCH_OP], Operations: [] }, 'invalidSyntax'],
      [{ Operations: [{ op: 'replace', path: 'title', value: 'x' }] }, 'invalidSyntax'],
      [{ schemas: [PATCH_OP], Operations: [{ op: 'move', path: 'title', value: 'x' }] }, 'invalidSyntax'],
      [{ schemas: [PATCH_OP], Operations: [{ op: 'copy', from: 'title', path: 'nickName' }] }, 'invalidSyntax'],
      [{ schemas: [PATCH_OP], Operations: [{ op: ['replace'], path: 'title', value: 'x' }] }, 'invalidSyntax'],
      [{ schemas: [PATCH_OP], Operations: [null] }, 'invalidSyntax'],
      [{ schemas: [PATCH_OP], Operations: [{ op: 'replace', path: 'title..x', value: 'x' }] }, 'invalidPath'],
      [{ schemas: [PATCH_OP], Operations: [{ op: 'replace', path: 'emails[type eq "work"', value: 'x' }] }, 'invalidPath'],
      [{ schemas: [PATCH_OP], Operations: [{ op: 'replace', path: 'emails[type eq "work"].value.x', value: 'x' }] }, 'invalidPath'],
      [{ schemas: [PATCH_OP], Operations: [{ op: 'replace', path: 'userName[value eq "x"]', value: 'x' }] }, 'invalidPath'],
      [{ schemas: [PATCH_OP], Operations: [{ op: 'replace', path: '"; drop table users; --', value: 'x' }] }, 'invalidPath'],
      [{ schemas: [PATCH_OP], Operations: [{ op: 'replace', path: { attr: 'title' }, value: 'x' }] }, 'invalidPath'],
      [{ schemas: [PATCH_OP], Operations: [{ op: 'replace', path: 'x'.repeat(5000), value: 'x' }] }, 'invalidPath'],
      [{ schemas: [PATCH_OP], Operations: [{ op: 'remove' }] }, 'noTarget'],
      [{ schemas: [PATCH_OP], Operations: [{ op: 'replace', path: 'active', value: 'perhaps' }] }, 'invalidValue'],
      [{ schemas: [PATCH_OP], Operations: [{ op: 'replace', value: 'x' }] }, 'invalidValue'],
      [{ schemas: [PATCH_OP], Operations: [{ op: 'add', path: 'groups', value: [{ value: group.id }] }] }, 'mutability'],
      [{ schemas: [PATCH_OP], Operations: [{ op: 'replace', path: 'id', value: '2819c223-7f76-453a-919d-413861904646' }] }, 'mutability'],
      [{ schemas: [PATCH_OP], Operations: Array.from({ length: 1001 }, () => ({ op: 'replace', path: 'title', value: 'x' })) }, 'invalidValue'],
    ];
    for (const [body, scimType] of bad) {
      const res = await scim(main, 'PATCH', `/Users/${mine.id}`, body);
      expect({ body: JSON.stringify(body).slice(0, 120), status: res.statusCode, scimType: res.json().scimType }).toEqual({ body: JSON.stringify(body).slice(0, 120), status: 400, scimType });
    }
    const groupBad: Array<[unknown, string]> = [
      [{ schemas: [PATCH_OP] }, 'invalidSyntax'],
      [{ schemas: [PATCH_OP], Operations: [{ op: 'move', path: 'members', value: [] }] }, 'invalidSyntax'],
      [{ schemas: [PATCH_OP], Operations: [{ op: 'remove', path: 'members[display eq "x"]' }] }, 'invalidPath'],
      [{ schemas: [PATCH_OP], Operations: [{ op: 'replace', path: 'owner', value: 'x' }] }, 'invalidPath'],
      [{ schemas: [PATCH_OP], Operations: [{ op: 'remove', path: 'displayName' }] }, 'invalidValue'],
      [{ schemas: [PATCH_OP], Operations: [{ op: 'replace', path: 'displayName', value: '   ' }] }, 'invalidValue'],
    ];
    for (const [body, scimType] of groupBad) {
      const res = await scim(main, 'PATCH', `/Groups/${group.id}`, body);
      expect({ body, status: res.statusCode, scimType: res.json().scimType }).toEqual({ body, status: 400, scimType });
    }
    // Nothing of these was applied.
    const after = ok(await scim(main, 'GET', `/Users/${mine.id}`), 200);
    expect(after).toMatchObject({ title: 'Keep', active: true, meta: { version: mine.meta && (mine.meta as { version: string }).version } });
    expect(ok(await scim(main, 'GET', `/Groups/${group.id}`), 200)).toMatchObject({ displayName: group.displayName, members: [expect.objectContaining({ value: mine.id })] });
  });

  it('caps or refuses hostile paging, never a 5xx', async () => {
    const list = (query: string) => scim(main, 'GET', `/Users?${query}`);
    const total = ok(await list('count=0'), 200).totalResults as number;
    expect(total).toBeGreaterThan(2);
    expect(ok(await list('count=-1'), 200)).toMatchObject({ totalResults: total, itemsPerPage: 0, Resources: [] });
    expect(ok(await list('count=-99999999999'), 200)).toMatchObject({ itemsPerPage: 0 });
    const capped = ok(await list('count=100000'), 200);
    expect(capped.itemsPerPage).toBe(Math.min(total, 1000));
    expect(ok(await list('count=999999999999999'), 200).itemsPerPage).toBe(Math.min(total, 1000));
    const first = ok(await list('count=1'), 200);
    expect(ok(await list('startIndex=0&count=1'), 200)).toMatchObject({ startIndex: 1, Resources: [{ id: first.Resources[0].id }] });
    expect(ok(await list('startIndex=-5&count=1'), 200)).toMatchObject({ startIndex: 1, Resources: [{ id: first.Resources[0].id }] });
    expect(ok(await list('startIndex=999999999999999'), 200)).toMatchObject({ totalResults: total, itemsPerPage: 0, Resources: [] });
    for (const query of ['count=abc', 'count=1.5', 'count=1e3', 'count=0x10', 'startIndex=abc', 'startIndex=1e309', `count=${'9'.repeat(400)}`, 'startIndex=9999999999999999999', 'count=NaN', 'count=Infinity']) {
      const res = await list(query);
      expect({ query, status: res.statusCode, scimType: res.json().scimType }).toEqual({ query, status: 400, scimType: 'invalidValue' });
    }
    for (const query of ['count=1&count=2', 'startIndex=1&startIndex=2']) {
      expect({ query, status: (await list(query)).statusCode }).toEqual({ query, status: 400 });
    }
    for (const query of ['attributes=userName)(', 'attributes=a.b.c.d', `attributes=${'a,'.repeat(2000)}`, 'excludedAttributes=%00']) {
      expect({ query, status: (await list(query)).statusCode }).toEqual({ query, status: 400 });
    }
    expect(ok(await scim(main, 'POST', '/Users/.search', { startIndex: -1, count: 100000 }), 200).itemsPerPage).toBe(Math.min(total, 1000));
    expect((await scim(main, 'POST', '/Users/.search', { count: 'many' })).statusCode).toBe(400);
    expect((await scim(main, 'POST', '/Users/.search', { count: { $gt: 1 } })).statusCode).toBe(400);
    expect(ok(await scim(main, 'GET', '/Groups?count=-1&startIndex=0'), 200)).toMatchObject({ startIndex: 1, itemsPerPage: 0 });
  });

  it('refuses members that are not UUIDs or not users of this directory: 400 invalidValue', async () => {
    const mine = await createdUser(main, plainUser(`${unique('member')}@acme.example`));
    const theirs = await createdUser(sibling, plainUser(`${unique('theirs')}@acme.example`));
    const group = await createdGroup(main, unique('Members '), [mine.id]);
    const otherGroup = await createdGroup(main, unique('Nested '));
    const bad: unknown[] = [
      'not-a-uuid',
      "' or 1=1 --",
      '',
      theirs.id,
      '2819c223-7f76-453a-919d-413861904646',
      otherGroup.id, // a group is not a user: nested groups are not supported
      42,
      null,
      { value: mine.id },
      'x'.repeat(10_000),
    ];
    for (const value of bad) {
      const members = [{ value: mine.id }, { value }];
      const label = JSON.stringify(value).slice(0, 60);
      for (const res of [
        await scim(main, 'POST', '/Groups', { schemas: [GROUP], displayName: unique('Bad members '), members }),
        await scim(main, 'PUT', `/Groups/${group.id}`, { schemas: [GROUP], displayName: group.displayName, members }),
        await scim(main, 'PATCH', `/Groups/${group.id}`, { schemas: [PATCH_OP], Operations: [{ op: 'add', path: 'members', value: members }] }),
        await scim(main, 'PATCH', `/Groups/${group.id}`, { schemas: [PATCH_OP], Operations: [{ op: 'replace', path: 'members', value: members }] }),
        await scim(main, 'PATCH', `/Groups/${group.id}`, { schemas: [PATCH_OP], Operations: [{ op: 'replace', value: { members } }] }),
      ]) {
        expect({ label, status: res.statusCode, scimType: res.json().scimType }).toEqual({ label, status: 400, scimType: 'invalidValue' });
      }
    }
    // Members as something else than a list of objects.
    for (const members of ['everyone', { value: mine.id, extra: { a: 1 } }, [mine.id], [[{ value: mine.id }]]]) {
      const res = await scim(main, 'POST', '/Groups', { schemas: [GROUP], displayName: unique('Shapes '), members });
      expect({ members, status: res.statusCode }).toEqual({ members, status: 400 });
    }
    // Removing a member that is not one is no error (RFC 7644 §3.5.2.2), and removes nobody else.
    ok(await scim(main, 'PATCH', `/Groups/${group.id}`, { schemas: [PATCH_OP], Operations: [{ op: 'remove', path: 'members', value: [{ value: theirs.id }, { value: 'not-a-uuid' }] }] }), 204);
    ok(await scim(main, 'PATCH', `/Groups/${group.id}`, { schemas: [PATCH_OP], Operations: [{ op: 'remove', path: `members[value eq "${theirs.id}"]` }] }), 204);
    expect(ok(await scim(main, 'GET', `/Groups/${group.id}`), 200).members).toEqual([expect.objectContaining({ value: mine.id })]);
    expect(ok(await scim(sibling, 'GET', `/Users/${theirs.id}`), 200).groups).toEqual([]);
  });
});

describe(`SCIM on ${BACKEND}: races`, () => {
  it('two PATCHes of one User with the same If-Match: exactly one 200, one 412', async () => {
    const mine = await createdUser(main, plainUser(`${unique('etag')}@acme.example`));
    const read = await scim(main, 'GET', `/Users/${mine.id}`);
    const etag = read.headers.etag as string;
    expect(etag).toBe((mine.meta as { version: string }).version);
    const patch = (title: string) => scim(main, 'PATCH', `/Users/${mine.id}`, { schemas: [PATCH_OP], Operations: [{ op: 'replace', path: 'title', value: title }] }, { 'if-match': etag });
    const results = await Promise.all([patch('first'), patch('second')]);
    expect(results.map((r) => r.statusCode).sort()).toEqual([200, 412]);
    const winner = results.find((r) => r.statusCode === 200)!;
    scimError(results.find((r) => r.statusCode === 412)!, 412);
    const now = ok(await scim(main, 'GET', `/Users/${mine.id}`), 200);
    expect(now.title).toBe(winner.json().title);
    expect(now.meta.version).toBe(winner.headers.etag);
    expect(now.meta.version).not.toBe(etag);
    // The same for a group's PATCH and PUT; then a DELETE with the old tag is refused too.
    const group = await createdGroup(main, unique('Etag '));
    const groupEtag = (await scim(main, 'GET', `/Groups/${group.id}`)).headers.etag as string;
    const groupResults = await Promise.all([
      scim(main, 'PATCH', `/Groups/${group.id}`, { schemas: [PATCH_OP], Operations: [{ op: 'add', path: 'members', value: [{ value: mine.id }] }] }, { 'if-match': groupEtag }),
      scim(main, 'PUT', `/Groups/${group.id}`, { schemas: [GROUP], displayName: group.displayName, members: [] }, { 'if-match': groupEtag }),
    ]);
    expect(groupResults.map((r) => (r.statusCode < 300 ? 'ok' : r.statusCode)).sort()).toEqual([412, 'ok']);
    scimError(await scim(main, 'DELETE', `/Groups/${group.id}`, undefined, { 'if-match': groupEtag }), 412);
    scimError(await scim(main, 'DELETE', `/Users/${mine.id}`, undefined, { 'if-match': etag }), 412);
  });

  it('20 concurrent creates of one userName, in one case or several: exactly one 201, the rest 409 uniqueness; one link, one account', async () => {
    for (const spell of [(s: string) => s, (s: string, i: number) => (i % 2 === 0 ? s.toUpperCase() : i % 3 === 0 ? s : s[0]!.toUpperCase() + s.slice(1))]) {
      const userName = `${unique('race')}@acme.example`;
      const results = await Promise.all(Array.from({ length: 20 }, (_, i) => scim(main, 'POST', '/Users', plainUser(spell(userName, i), { externalId: `ext-${i}` }))));
      const statuses = results.map((r) => r.statusCode);
      expect(statuses.filter((s) => s === 201)).toHaveLength(1);
      expect(statuses.filter((s) => s === 409)).toHaveLength(19);
      for (const res of results.filter((r) => r.statusCode === 409)) scimError(res, 409, 'uniqueness');
      const links = await directoryUsers(main, userName);
      expect(links).toHaveLength(1);
      expect(await accounts(userName)).toEqual([{ id: links[0]!.user_id }]);
      expect(results.find((r) => r.statusCode === 201)!.json().id).toBe(links[0]!.id);
    }
  });

  it('20 concurrent creates of different users with one address: one account', async () => {
    const email = `${unique('shared')}@acme.example`;
    const results = await Promise.all(
      Array.from({ length: 20 }, (_, i) => scim(main, 'POST', '/Users', plainUser(`${unique('alias')}@acme.example`, { emails: [{ value: i % 2 ? email : email.toUpperCase(), type: 'work', primary: true }] }))),
    );
    const statuses = results.map((r) => r.statusCode);
    expect(statuses.filter((s) => s === 201)).toHaveLength(1);
    for (const res of results.filter((r) => r.statusCode !== 201)) scimError(res, 409, 'uniqueness');
    const account = await accounts(email);
    expect(account).toHaveLength(1);
    expect(await db().selectFrom('directory_users').select('id').where('user_id', '=', account[0]!.id).execute()).toEqual([{ id: results.find((r) => r.statusCode === 201)!.json().id }]);
  });
});

describe(`SCIM on ${BACKEND}: token rotation`, () => {
  it('refuses the rotated token at once; the new one works', async () => {
    const rotating = await newDirectory(org.organizationId, 'Rotating');
    const mine = await createdUser(rotating, plainUser(`${unique('rotate')}@acme.example`));
    const { token } = await rotateDirectoryToken(db(), org.organizationId, rotating.id);
    expect(token).not.toBe(rotating.token);
    const res = await scim(rotating, 'GET', `/Users/${mine.id}`);
    scimError(res, 401);
    expect(res.headers['www-authenticate']).toMatch(/^Bearer /);
    scimError(await scim(rotating, 'POST', '/Users', plainUser(`${unique('late')}@acme.example`)), 401);
    const renewed = { id: rotating.id, token };
    expect(ok(await scim(renewed, 'GET', `/Users/${mine.id}`), 200).id).toBe(mine.id);
    ok(await scim(renewed, 'PATCH', `/Users/${mine.id}`, { schemas: [PATCH_OP], Operations: [{ op: 'replace', value: { active: false } }] }), 200);
    // The new token is this directory's only.
    scimError(await scim({ id: main.id, token }, 'GET', '/Users'), 401);
  });
});
