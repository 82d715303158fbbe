/**
 * SCIM PATCH (RFC 7644 §3.5.2) as Okta and Entra ID send it: their documented bodies, written
 * here literally; the refusals; and, for standard operations, the npm package scim-patch as an
 * oracle (same resource, same operations, same result), on fixed cases and on random sequences.
 */
import fc from 'fast-check';
import { scimPatch, type ScimPatchOperation, type ScimResource } from 'scim-patch';
import { describe, expect, it } from 'vitest';
import { applyGroupPatch, applyUserPatch, MAX_MEMBER_IDS, parsePatchRequest, type PatchOperation } from '../../src/directory/patch.js';
import { ScimError } from '../../src/directory/scim-errors.js';

const PATCH_OP = 'urn:ietf:params:scim:api:messages:2.0:PatchOp';
const ENTERPRISE = 'urn:ietf:params:scim:schemas:extension:enterprise:2.0:User';

function scimError(fn: () => unknown): ScimError {
  try {
    fn();
  } catch (err) {
    if (err instanceof ScimError) return err;
    throw err;
  }
  throw new Error('expected a ScimError');
}

function deepFreeze<T>(value: T): T {
  if (value && typeof value === 'object') {
    for (const v of Object.values(value)) deepFreeze(v);
    Object.freeze(value);
  }
  return value;
}

const user = (): Record<string, unknown> => ({
  schemas: ['urn:ietf:params:scim:schemas:core:2.0:User', ENTERPRISE],
  userName: 'Test_User_00aa00aa-00aa-00aa-00aa-00aa00aa00aa',
  externalId: '0a21f0f2-8d2a-4f8e-bf98-7363c4aed4ef',
  active: true,
  displayName: 'Barbara Jensen',
  name: { givenName: 'Barbara', familyName: 'Jensen', formatted: 'Barbara Jensen' },
  emails: [
    { value: 'Test_User_fd0ea19b@testuser.com', type: 'work', primary: true },
    { value: 'babs@home.example.org', type: 'home' },
  ],
  title: 'Tour Guide',
  [ENTERPRISE]: { employeeNumber: '701984', department: 'Tour Operations' },
});

/** Parses a full request body, then applies it. */
const patchUser = (resource: Record<string, unknown>, body: unknown, options: { id?: string } = {}) => applyUserPatch(resource, parsePatchRequest(body), options);

describe('parsePatchRequest', () => {
  it("normalizes Entra's capitalized ops and accepts `operations`", () => {
    const ops = parsePatchRequest({ schemas: [PATCH_OP], Operations: [{ op: 'Replace', path: 'active', value: 'False' }, { op: 'Add', path: 'title', value: 'x' }, { op: 'REMOVE', path: 'nickName' }] });
    expect(ops).toEqual([
      { op: 'replace', path: 'active', value: 'False' },
      { op: 'add', path: 'title', value: 'x' },
      { op: 'remove', path: 'nickName' },
    ]);
    expect(parsePatchRequest({ schemas: [PATCH_OP], operations: [{ op: 'replace', value: { active: false } }] })).toEqual([{ op: 'replace', value: { active: false } }]);
  });

  it('refuses what is not a PatchOp request', () => {
    const cases: Array<[unknown, string]> = [
      [null, 'invalidSyntax'],
      [[], 'invalidSyntax'],
      ['{}', 'invalidSyntax'],
      [{ Operations: [{ op: 'replace', path: 'title', value: 'x' }] }, 'invalidSyntax'],
      [{ schemas: ['urn:ietf:params:scim:schemas:core:2.0:User'], Operations: [{ op: 'replace', path: 'title', value: 'x' }] }, 'invalidSyntax'],
      [{ schemas: [PATCH_OP] }, 'invalidSyntax'],
      [{ schemas: [PATCH_OP], Operations: [] }, 'invalidSyntax'],
      [{ schemas: [PATCH_OP], Operations: {} }, 'invalidSyntax'],
      [{ schemas: [PATCH_OP], Operations: ['replace'] }, 'invalidSyntax'],
      [{ schemas: [PATCH_OP], Operations: [{ op: 'move', path: 'title', value: 'x' }] }, 'invalidSyntax'],
      [{ schemas: [PATCH_OP], Operations: [{ path: 'title', value: 'x' }] }, 'invalidSyntax'],
      [{ schemas: [PATCH_OP], Operations: [{ op: 'add', path: 'title' }] }, 'invalidSyntax'],
      [{ schemas: [PATCH_OP], Operations: [{ op: 'remove' }] }, 'noTarget'],
      [{ schemas: [PATCH_OP], Operations: [{ op: 'remove', path: '' }] }, 'noTarget'],
      [{ schemas: [PATCH_OP], Operations: [{ op: 'replace', value: 'x' }] }, 'invalidValue'],
      [{ schemas: [PATCH_OP], Operations: [{ op: 'replace', value: [{ active: false }] }] }, 'invalidValue'],
      [{ schemas: [PATCH_OP], Operations: [{ op: 'replace', path: 42, value: 'x' }] }, 'invalidPath'],
      [{ schemas: [PATCH_OP], Operations: [{ op: 'replace', path: 'emails[type eq "work"', value: 'x' }] }, 'invalidPath'],
      [{ schemas: [PATCH_OP], Operations: [{ op: 'replace', path: 'name.givenName.first', value: 'x' }] }, 'invalidPath'],
      [{ schemas: [PATCH_OP], Operations: [{ op: 'remove', path: 'emails[type eq work]' }] }, 'invalidPath'],
    ];
    for (const [body, type] of cases) {
      const err = scimError(() => parsePatchRequest(body));
      expect({ body, status: err.statusCode, type: err.scimType }).toEqual({ body, status: 400, type });
    }
  });

  it('takes at most 1,000 operations', () => {
    const ops = (n: number) => ({ schemas: [PATCH_OP], Operations: Array.from({ length: n }, () => ({ op: 'replace', path: 'title', value: 'x' })) });
    expect(parsePatchRequest(ops(1000))).toHaveLength(1000);
    expect(scimError(() => parsePatchRequest(ops(1001))).scimType).toBe('invalidValue');
  });
});

describe('applyUserPatch: Entra ID', () => {
  // learn.microsoft.com/entra/identity/app-provisioning/use-scim-to-provision-users-and-groups,
  // "Update User [Multi-valued properties]".
  it('replaces the work email and the family name', () => {
    const body = {
      schemas: ['urn:ietf:params:scim:api:messages:2.0:PatchOp'],
      Operations: [
        { op: 'Replace', path: 'emails[type eq "work"].value', value: 'updatedEmail@microsoft.com' },
        { op: 'Replace', path: 'name.familyName', value: 'updatedFamilyName' },
      ],
    };
    const out = patchUser(user(), body);
    expect(out.emails).toEqual([
      { value: 'updatedEmail@microsoft.com', type: 'work', primary: true },
      { value: 'babs@home.example.org', type: 'home' },
    ]);
    expect(out.name).toEqual({ givenName: 'Barbara', familyName: 'updatedFamilyName', formatted: 'Barbara Jensen' });
  });

  // The same document, "Update User [Single-valued properties]" and "Disable User".
  it('replaces userName, and disables the user', () => {
    const renamed = patchUser(user(), { schemas: ['urn:ietf:params:scim:api:messages:2.0:PatchOp'], Operations: [{ op: 'Replace', path: 'userName', value: '5b50642d-79fc-4410-9e90-4c077cdd1a59@testuser.com' }] });
    expect(renamed.userName).toBe('5b50642d-79fc-4410-9e90-4c077cdd1a59@testuser.com');
    const disabled = patchUser(user(), { Operations: [{ op: 'Replace', path: 'active', value: false }], schemas: ['urn:ietf:params:scim:api:messages:2.0:PatchOp'] });
    expect(disabled.active).toBe(false);
  });

  // learn.microsoft.com/entra/identity/app-provisioning/application-provisioning-config-problem-scim-compatibility:
  // without the aadOptscim062020 flag, Entra sends booleans as strings and several attributes in
  // one path-less replace, the keys being paths.
  it('takes "False"/"True" strings for active, and path-less replace with dotted, filtered and URN keys', () => {
    const out = patchUser(user(), {
      schemas: ['urn:ietf:params:scim:api:messages:2.0:PatchOp'],
      Operations: [
        { op: 'Replace', path: 'active', value: 'False' },
        {
          op: 'replace',
          value: {
            displayName: 'Pvlo',
            'emails[type eq "work"].value': 'TestBcwqnm@test.microsoft.com',
            'name.givenName': 'Gtfd',
            'name.familyName': 'Pkqf',
            externalId: 'Eqpj',
            'urn:ietf:params:scim:schemas:extension:enterprise:2.0:User:employeeNumber': 'Eqpj',
          },
        },
      ],
    });
    expect(out).toMatchObject({
      active: false,
      displayName: 'Pvlo',
      externalId: 'Eqpj',
      name: { givenName: 'Gtfd', familyName: 'Pkqf', formatted: 'Barbara Jensen' },
      [ENTERPRISE]: { employeeNumber: 'Eqpj', department: 'Tour Operations' },
    });
    expect((out.emails as unknown[])[0]).toEqual({ value: 'TestBcwqnm@test.microsoft.com', type: 'work', primary: true });
    expect(patchUser(out, { schemas: [PATCH_OP], Operations: [{ op: 'replace', value: { active: 'TRUE' } }] }).active).toBe(true);
    expect(scimError(() => patchUser(user(), { schemas: [PATCH_OP], Operations: [{ op: 'replace', path: 'active', value: 'maybe' }] })).scimType).toBe('invalidValue');
  });

  // learn.microsoft.com Q&A "Entra ID patch sending Add instead of Replace" (2024): an Add through
  // a value filter, for a user who has no work address yet, must create it.
  it('adds through a value filter that matches nothing by appending the element the filter names', () => {
    const body = {
      schemas: ['urn:ietf:params:scim:api:messages:2.0:PatchOp'],
      Operations: [
        { op: 'Replace', path: 'title', value: 'tester' },
        { op: 'Add', path: 'emails[type eq "work"].value', value: 'joe@joe.com' },
      ],
    };
    const out = patchUser({ userName: 'joe', emails: [{ value: 'joe@home.example', type: 'home' }] }, body);
    expect(out).toEqual({ userName: 'joe', title: 'tester', emails: [{ value: 'joe@home.example', type: 'home' }, { type: 'work', value: 'joe@joe.com' }] });
    const both = patchUser({ userName: 'joe' }, { schemas: [PATCH_OP], Operations: [{ op: 'replace', path: 'emails[type eq "work" and primary eq true].value', value: 'w@example.com' }] });
    expect(both.emails).toEqual([{ type: 'work', primary: true, value: 'w@example.com' }]);
    expect(scimError(() => patchUser({ userName: 'joe' }, { schemas: [PATCH_OP], Operations: [{ op: 'replace', path: 'emails[value co "x"].type', value: 'work' }] })).scimType).toBe('noTarget');
  });

  // The same documents' enterprise extension: the manager as a complex attribute under its URN.
  it('sets the manager under the enterprise URN, whole or by sub-attribute', () => {
    const out = patchUser(user(), {
      schemas: [PATCH_OP],
      Operations: [
        { op: 'Add', path: 'urn:ietf:params:scim:schemas:extension:enterprise:2.0:User:manager', value: { value: '26118915-6090-4610-87e4-49d8ca9f808d' } },
        { op: 'Replace', path: 'urn:ietf:params:scim:schemas:extension:enterprise:2.0:User:department', value: 'Engineering' },
      ],
    });
    expect(out[ENTERPRISE]).toEqual({ employeeNumber: '701984', department: 'Engineering', manager: { value: '26118915-6090-4610-87e4-49d8ca9f808d' } });
    const again = patchUser(out, { schemas: [PATCH_OP], Operations: [{ op: 'replace', path: `${ENTERPRISE}:manager.value`, value: 'other' }, { op: 'remove', path: `${ENTERPRISE}:employeeNumber` }] });
    expect(again[ENTERPRISE]).toEqual({ department: 'Engineering', manager: { value: 'other' } });
    const fresh = patchUser({ userName: 'x' }, { schemas: [PATCH_OP], Operations: [{ op: 'add', path: ENTERPRISE, value: { Department: 'Sales', manager: { value: 'm' } } }] });
    expect(fresh).toEqual({ userName: 'x', [ENTERPRISE]: { department: 'Sales', manager: { value: 'm' } } });
    expect(patchUser(fresh, { schemas: [PATCH_OP], Operations: [{ op: 'remove', path: `${ENTERPRISE}:manager` }] })[ENTERPRISE]).toEqual({ department: 'Sales' });
  });
});

describe('applyUserPatch: Okta', () => {
  // developer.okta.com/docs/api/openapi/okta-scim/guides/scim-20, "Update a specific User (PATCH)":
  // deactivation is a path-less replace.
  it('deactivates and reactivates with a path-less replace', () => {
    const off = patchUser(user(), { schemas: ['urn:ietf:params:scim:api:messages:2.0:PatchOp'], Operations: [{ op: 'replace', value: { active: false } }] });
    expect(off).toEqual({ ...user(), active: false });
    const on = patchUser(off, { schemas: ['urn:ietf:params:scim:api:messages:2.0:PatchOp'], Operations: [{ op: 'replace', value: { active: true } }] });
    expect(on).toEqual(user());
  });

  it('lets an echo of the id through and refuses another id, meta ignored', () => {
    const id = '23a35c27-23d3-4c03-b4c5-6443c09e7173';
    const ok = patchUser(user(), { schemas: [PATCH_OP], Operations: [{ op: 'replace', value: { id, active: false, meta: { resourceType: 'User' } } }] }, { id });
    expect(ok).toEqual({ ...user(), active: false });
    expect(patchUser({ ...user(), id }, { schemas: [PATCH_OP], Operations: [{ op: 'replace', path: 'id', value: id }] })).toEqual({ ...user(), id });
    for (const op of [{ op: 'replace', value: { id: 'someone-else' } }, { op: 'replace', path: 'id', value: 'x' }, { op: 'remove', path: 'id' }]) {
      expect(scimError(() => patchUser(user(), { schemas: [PATCH_OP], Operations: [op] }, { id })).scimType).toBe('mutability');
    }
    expect(patchUser(user(), { schemas: [PATCH_OP], Operations: [{ op: 'replace', path: 'meta.lastModified', value: 'x' }] })).toEqual(user());
    expect(scimError(() => patchUser(user(), { schemas: [PATCH_OP], Operations: [{ op: 'add', path: 'groups', value: [{ value: 'g' }] }] })).scimType).toBe('mutability');
  });
});

describe('applyUserPatch: the RFC', () => {
  it('returns a new object and leaves its input as it was, also when an operation fails', () => {
    const input = deepFreeze(user());
    const out = patchUser(input, { schemas: [PATCH_OP], Operations: [{ op: 'replace', path: 'name.givenName', value: 'B' }, { op: 'add', path: 'emails', value: [{ value: 'c@example.com', type: 'other' }] }] });
    expect(out).not.toBe(input);
    expect(input).toEqual(user());
    expect((out.name as Record<string, unknown>).givenName).toBe('B');
    const copy = user();
    expect(() => applyUserPatch(copy, [{ op: 'replace', path: 'title', value: 'changed' }, { op: 'replace', path: 'active', value: 'nope' }])).toThrow(ScimError);
    expect(copy).toEqual(user());
  });

  it('matches attribute names without case and writes the schema’s spelling', () => {
    const out = patchUser({ username: 'old', Name: { GIVENNAME: 'a' } }, {
      schemas: [PATCH_OP],
      Operations: [
        { op: 'replace', path: 'USERNAME', value: 'new' },
        { op: 'replace', path: 'name.givenname', value: 'b' },
        { op: 'replace', path: 'urn:ietf:params:scim:schemas:core:2.0:User:DisplayName', value: 'D' },
        { op: 'add', path: 'URN:IETF:PARAMS:SCIM:SCHEMAS:EXTENSION:ENTERPRISE:2.0:USER:COSTCENTER', value: '4130' },
      ],
    });
    expect(out).toEqual({ userName: 'new', name: { givenName: 'b' }, displayName: 'D', [ENTERPRISE]: { costCenter: '4130' } });
  });

  it('adds to multi-valued attributes without duplicates, and keeps one primary', () => {
    const out = patchUser(user(), {
      schemas: [PATCH_OP],
      Operations: [
        { op: 'add', path: 'emails', value: [{ value: 'BABS@home.example.org', type: 'home' }, { value: 'new@example.com', type: 'other', primary: 'True' }] },
        { op: 'add', path: 'phoneNumbers', value: { value: '+1 555 0100', type: 'work' } },
      ],
    });
    expect(out.emails).toEqual([
      { value: 'Test_User_fd0ea19b@testuser.com', type: 'work', primary: false },
      { value: 'BABS@home.example.org', type: 'home' },
      { value: 'new@example.com', type: 'other', primary: true },
    ]);
    expect(out.phoneNumbers).toEqual([{ value: '+1 555 0100', type: 'work' }]);
  });

  it('removes by value filter, a sub-attribute, a listed value, or the attribute', () => {
    const u = user();
    expect(patchUser(u, { schemas: [PATCH_OP], Operations: [{ op: 'remove', path: 'emails[type eq "home"]' }] }).emails).toEqual([{ value: 'Test_User_fd0ea19b@testuser.com', type: 'work', primary: true }]);
    expect(patchUser(u, { schemas: [PATCH_OP], Operations: [{ op: 'remove', path: 'emails[type eq "work"].primary' }] }).emails).toEqual([
      { value: 'Test_User_fd0ea19b@testuser.com', type: 'work' },
      { value: 'babs@home.example.org', type: 'home' },
    ]);
    expect(patchUser(u, { schemas: [PATCH_OP], Operations: [{ op: 'remove', path: 'emails', value: [{ value: 'babs@home.example.org' }] }] }).emails).toHaveLength(1);
    expect('emails' in patchUser(u, { schemas: [PATCH_OP], Operations: [{ op: 'remove', path: 'emails[type pr]' }] })).toBe(false);
    expect('emails' in patchUser(u, { schemas: [PATCH_OP], Operations: [{ op: 'remove', path: 'emails' }] })).toBe(false);
    expect(patchUser(u, { schemas: [PATCH_OP], Operations: [{ op: 'remove', path: 'emails[type eq "fax"]' }] })).toEqual(u);
    expect(patchUser(u, { schemas: [PATCH_OP], Operations: [{ op: 'remove', path: 'nickName' }, { op: 'remove', path: 'addresses[type eq "work"]' }] })).toEqual(u);
  });

  it('merges sub-attributes on replace of a complex attribute, with or without a path; null unassigns', () => {
    const a = patchUser(user(), { schemas: [PATCH_OP], Operations: [{ op: 'replace', path: 'name', value: { givenName: 'B', middleName: 'J' } }] });
    expect(a.name).toEqual({ givenName: 'B', middleName: 'J', familyName: 'Jensen', formatted: 'Barbara Jensen' });
    const b = patchUser(user(), { schemas: [PATCH_OP], Operations: [{ op: 'replace', value: { name: { familyName: 'J', formatted: null } } }] });
    expect(b.name).toEqual({ givenName: 'Barbara', familyName: 'J' });
    const c = patchUser(user(), { schemas: [PATCH_OP], Operations: [{ op: 'replace', path: 'title', value: null }] });
    expect('title' in c).toBe(false);
  });

  it('keeps attributes no schema names, and refuses value filters where they make no sense', () => {
    expect(patchUser({ userName: 'x' }, { schemas: [PATCH_OP], Operations: [{ op: 'add', value: { customThing: 'x', 'urn:example:ext:1.0:User:badge': '7' } }] })).toEqual({ userName: 'x', customThing: 'x', 'urn:example:ext:1.0:User': { badge: '7' } });
    for (const path of ['userName[value eq "x"]', 'name[givenName eq "x"]', `${ENTERPRISE}:manager[value eq "x"]`, 'userName.first', 'urn:ietf:params:scim:schemas:core:2.0:Group:displayName']) {
      expect({ path, type: scimError(() => patchUser(user(), { schemas: [PATCH_OP], Operations: [{ op: 'replace', path, value: 'x' }] })).scimType }).toEqual({ path, type: 'invalidPath' });
    }
    expect(scimError(() => patchUser(user(), { schemas: [PATCH_OP], Operations: [{ op: 'replace', path: 'name', value: 'x' }] })).scimType).toBe('invalidValue');
  });
});

describe('applyUserPatch agrees with scim-patch on standard operations', () => {
  const base = (): ScimResource & Record<string, unknown> => ({ ...user(), meta: { created: new Date(0), lastModified: new Date(0) } }) as ScimResource & Record<string, unknown>;
  // Each gets its own copy of the operations: scim-patch puts (and later changes) the objects of
  // an operation's value into its result, and one object may stand in several operations.
  const oracle = (ops: ScimPatchOperation[]) => JSON.parse(JSON.stringify(scimPatch(base(), JSON.parse(JSON.stringify(ops)), { mutateDocument: false, treatMissingAsAdd: true })));
  const ours = (ops: ScimPatchOperation[]) => JSON.parse(JSON.stringify(applyUserPatch(base(), JSON.parse(JSON.stringify(ops)) as PatchOperation[])));

  const cases: Array<[string, ScimPatchOperation[]]> = [
    ['replace userName', [{ op: 'replace', path: 'userName', value: 'bjensen' }]],
    ['replace name.givenName', [{ op: 'replace', path: 'name.givenName', value: 'Babs' }]],
    ['add a new attribute', [{ op: 'add', path: 'nickName', value: 'Babs' }]],
    ['remove an attribute', [{ op: 'remove', path: 'title' }]],
    ['remove a sub-attribute', [{ op: 'remove', path: 'name.familyName' }]],
    ['add emails', [{ op: 'add', path: 'emails', value: [{ value: 'third@example.com', type: 'other' }] }]],
    ['replace emails', [{ op: 'replace', path: 'emails', value: [{ value: 'only@example.com', type: 'work' }] }]],
    ['replace a filtered value', [{ op: 'replace', path: 'emails[type eq "work"].value', value: 'new@example.com' }]],
    ['replace a filtered element', [{ op: 'replace', path: 'emails[type eq "home"]', value: { display: 'Home' } }]],
    ['add a filtered value that matches nothing', [{ op: 'add', path: 'emails[type eq "other"].value', value: 'o@example.com' }]],
    ['remove filtered elements', [{ op: 'remove', path: 'emails[type eq "home"]' }]],
    ['remove every element by filter', [{ op: 'remove', path: 'emails[value co "@"]' }]],
    ['replace name with some sub-attributes', [{ op: 'replace', path: 'name', value: { givenName: 'B' } }]],
    ['path-less replace of simple attributes', [{ op: 'replace', value: { displayName: 'BJ', title: 'Boss', active: false } }]],
    ['path-less add', [{ op: 'add', value: { nickName: 'B', userType: 'Employee' } }]],
    ['replace active', [{ op: 'replace', path: 'active', value: false }]],
    ['replace an enterprise attribute', [{ op: 'replace', path: `${ENTERPRISE}:department`, value: 'Engineering' }]],
    ['add an enterprise complex attribute', [{ op: 'add', path: `${ENTERPRISE}:manager`, value: { value: 'm-1' } }]],
    ['remove an enterprise attribute', [{ op: 'remove', path: `${ENTERPRISE}:employeeNumber` }]],
    ['add to an existing multi-valued attribute', [{ op: 'add', path: 'emails', value: { value: 'single@example.com', type: 'other' } }]],
    [
      'a sequence',
      [
        { op: 'remove', path: 'emails' },
        { op: 'add', path: 'emails', value: [{ value: 'a@example.com', type: 'work' }] },
        { op: 'replace', path: 'emails[type eq "work"].value', value: 'b@example.com' },
        { op: 'replace', path: 'name.familyName', value: 'J' },
        { op: 'remove', path: 'name.formatted' },
      ],
    ],
  ];
  for (const [name, ops] of cases) {
    it(name, () => {
      expect(ours(ops)).toEqual(oracle(ops));
    });
  }

  it('on random sequences of standard operations', () => {
    const fresh = fc.integer({ min: 0, max: 9 }).map((n) => `new${n}@example.com`);
    const pooled = fc.constantFrom({ value: 'p1@example.com', type: 'work' }, { value: 'p2@example.com', type: 'home' }, { value: 'p3@example.com', type: 'other' });
    const word = fc.constantFrom('A', 'B', 'C');
    const op: fc.Arbitrary<ScimPatchOperation> = fc.oneof(
      fc.record({ op: fc.constant('replace' as const), path: fc.constantFrom('userName', 'title', 'displayName', 'name.givenName', 'name.familyName', `${ENTERPRISE}:department`), value: word }),
      fc.record({ op: fc.constant('add' as const), path: fc.constantFrom('nickName', 'title', 'name.middleName', `${ENTERPRISE}:costCenter`), value: word }),
      fc.record({ op: fc.constant('remove' as const), path: fc.constantFrom('title', 'nickName', 'name.givenName', 'name', 'emails', `${ENTERPRISE}:department`, 'emails[type eq "home"]', 'emails[value eq "p1@example.com"]') }),
      fc.record({ op: fc.constant('add' as const), path: fc.constant('emails'), value: fc.uniqueArray(pooled, { minLength: 1, maxLength: 3, selector: (e) => e.value }) }),
      fc.record({ op: fc.constantFrom('add' as const, 'replace' as const), path: fc.constantFrom('emails[type eq "work"].value', 'emails[type eq "home"].value'), value: fresh }),
      fc.record({ op: fc.constant('replace' as const), path: fc.constant('name'), value: fc.record({ givenName: word }) }),
      fc.record({ op: fc.constant('replace' as const), value: fc.record({ displayName: word, active: fc.boolean() }) }),
    );
    fc.assert(
      fc.property(fc.array(op, { minLength: 1, maxLength: 8 }), (ops) => {
        let expected: unknown;
        try {
          expected = oracle(ops);
        } catch {
          // scim-patch refuses some of these (a filter on an absent array, say); we are not
          // compared where it has no answer.
          fc.pre(false);
        }
        expect(ours(ops)).toEqual(expected);
      }),
      { numRuns: 500 },
    );
  });
});

describe('applyGroupPatch', () => {
  const group = { displayName: 'Test SCIMv2', externalId: null };
  const patchGroup = (body: unknown, g: Parameters<typeof applyGroupPatch>[0] = group) => applyGroupPatch(g, parsePatchRequest(body));

  // developer.okta.com/docs/api/openapi/okta-scim/guides/scim-20, "Update a specific Group name",
  // "Add/Remove/Replace Group members".
  it("applies Okta's group operations", () => {
    const renamed = patchGroup(
      { schemas: ['urn:ietf:params:scim:api:messages:2.0:PatchOp'], Operations: [{ op: 'replace', value: { id: 'abf4dd94-a4c0-4f67-89c9-76b03340cb9b', displayName: 'Test SCIMv2' } }] },
      { id: 'abf4dd94-a4c0-4f67-89c9-76b03340cb9b', displayName: 'Old', externalId: null },
    );
    expect(renamed).toEqual({ displayName: 'Test SCIMv2', externalId: null, members: [] });
    expect(patchGroup({ schemas: [PATCH_OP], Operations: [{ op: 'replace', value: { id: 'abf4dd94-a4c0-4f67-89c9-76b03340cb9b', displayName: 'X' } }] }).displayName).toBe('X');
    expect(
      scimError(() => patchGroup({ schemas: [PATCH_OP], Operations: [{ op: 'replace', value: { id: 'another', displayName: 'X' } }] }, { id: 'abf4dd94-a4c0-4f67-89c9-76b03340cb9b', displayName: 'Old', externalId: null })).scimType,
    ).toBe('mutability');

    const added = patchGroup({
      schemas: ['urn:ietf:params:scim:api:messages:2.0:PatchOp'],
      Operations: [{ op: 'add', path: 'members', value: [{ value: '23a35c27-23d3-4c03-b4c5-6443c09e7173', display: 'test.user@okta.local' }] }],
    });
    expect(added.members).toEqual([{ op: 'add', ids: ['23a35c27-23d3-4c03-b4c5-6443c09e7173'] }]);

    const removed = patchGroup({ schemas: ['urn:ietf:params:scim:api:messages:2.0:PatchOp'], Operations: [{ op: 'remove', path: 'members[value eq "89bb1940-b905-4575-9e7f-6f887cfb368e"]' }] });
    expect(removed.members).toEqual([{ op: 'remove', ids: ['89bb1940-b905-4575-9e7f-6f887cfb368e'] }]);

    const replaced = patchGroup({
      schemas: ['urn:ietf:params:scim:api:messages:2.0:PatchOp'],
      Operations: [{ op: 'replace', path: 'members', value: [{ value: '23a35c27-23d3-4c03-b4c5-6443c09e7173', display: 'test.user@okta.local' }, { value: '89bb1940-b905-4575-9e7f-6f887cfb368e', display: 'test.user@example.com' }] }],
    });
    expect(replaced.members).toEqual([{ op: 'replace', ids: ['23a35c27-23d3-4c03-b4c5-6443c09e7173', '89bb1940-b905-4575-9e7f-6f887cfb368e'] }]);
  });

  // learn.microsoft.com/entra/identity/app-provisioning/use-scim-to-provision-users-and-groups,
  // "Update Group [Add Members]", "[Remove Members]", "[Non-member attributes]".
  it("applies Entra ID's group operations", () => {
    const add = patchGroup({ schemas: ['urn:ietf:params:scim:api:messages:2.0:PatchOp'], Operations: [{ op: 'Add', path: 'members', value: [{ $ref: null, value: 'f648f8d5ea4e4cd38e9c' }] }] });
    expect(add.members).toEqual([{ op: 'add', ids: ['f648f8d5ea4e4cd38e9c'] }]);
    const remove = patchGroup({ schemas: ['urn:ietf:params:scim:api:messages:2.0:PatchOp'], Operations: [{ op: 'Remove', path: 'members', value: [{ $ref: null, value: 'f648f8d5ea4e4cd38e9c' }] }] });
    expect(remove.members).toEqual([{ op: 'remove', ids: ['f648f8d5ea4e4cd38e9c'] }]);
    const rename = patchGroup({ schemas: ['urn:ietf:params:scim:api:messages:2.0:PatchOp'], Operations: [{ op: 'Replace', path: 'displayName', value: '1879db59-3bdf-4490-ad68-ab880a269474updatedDisplayName' }] });
    expect(rename).toEqual({ displayName: '1879db59-3bdf-4490-ad68-ab880a269474updatedDisplayName', externalId: null, members: [] });
  });

  it('keeps membership changes in order, never loading members', () => {
    const out = patchGroup({
      schemas: [PATCH_OP],
      Operations: [
        { op: 'remove', path: 'members' },
        { op: 'add', path: 'members', value: [{ value: 'a' }, { value: 'b' }] },
        { op: 'remove', path: 'members[value eq "a" or value eq "c"]' },
        { op: 'replace', value: { displayName: 'New', externalId: 'ext-9', members: [{ value: 'z' }] } },
        { op: 'add', path: 'members', value: [] },
        { op: 'add', value: { members: { value: 'y' } } },
        { op: 'replace', path: 'members', value: [] },
        { op: 'remove', path: 'externalId' },
        { op: 'replace', path: 'urn:ietf:params:scim:schemas:core:2.0:Group:displayName', value: 'Newer' },
      ],
    });
    expect(out).toEqual({
      displayName: 'Newer',
      externalId: null,
      members: [{ op: 'remove_all' }, { op: 'add', ids: ['a', 'b'] }, { op: 'remove', ids: ['a', 'c'] }, { op: 'replace', ids: ['z'] }, { op: 'add', ids: ['y'] }, { op: 'replace', ids: [] }],
    });
  });

  it('refuses what it cannot apply', () => {
    const cases: Array<[object, string]> = [
      [{ op: 'remove', path: 'members[display eq "x"]' }, 'invalidPath'],
      [{ op: 'add', path: 'members[value eq "x"]', value: [{ value: 'x' }] }, 'invalidPath'],
      [{ op: 'replace', path: 'members.value', value: 'x' }, 'invalidPath'],
      [{ op: 'add', path: 'members', value: ['x'] }, 'invalidValue'],
      [{ op: 'add', path: 'members', value: [{ display: 'x' }] }, 'invalidValue'],
      [{ op: 'remove', path: 'displayName' }, 'invalidValue'],
      [{ op: 'replace', path: 'displayName', value: 5 }, 'invalidValue'],
      [{ op: 'replace', path: 'externalId', value: {} }, 'invalidValue'],
      [{ op: 'replace', path: 'owner', value: 'x' }, 'invalidPath'],
      [{ op: 'replace', path: 'urn:ietf:params:scim:schemas:core:2.0:User:userName', value: 'x' }, 'invalidPath'],
      [{ op: 'remove', path: 'id' }, 'mutability'],
    ];
    for (const [op, type] of cases) {
      expect({ op, type: scimError(() => patchGroup({ schemas: [PATCH_OP], Operations: [op] })).scimType }).toEqual({ op, type });
    }
  });

  it(`takes at most ${MAX_MEMBER_IDS} member ids in one PATCH`, () => {
    const ids = (n: number, from = 0) => Array.from({ length: n }, (_, i) => ({ value: `u${from + i}` }));
    expect(patchGroup({ schemas: [PATCH_OP], Operations: [{ op: 'add', path: 'members', value: ids(6000) }, { op: 'remove', path: 'members', value: ids(4000, 6000) }] }).members).toHaveLength(2);
    const err = scimError(() => patchGroup({ schemas: [PATCH_OP], Operations: [{ op: 'add', path: 'members', value: ids(6000) }, { op: 'replace', path: 'members', value: ids(4001, 6000) }] }));
    expect(err.scimType).toBe('invalidValue');
    expect(err.description).toMatch(/10000/);
  });
});
