/**
 * SCIM filters (RFC 7644 §3.4.2.2): the reader on the RFC's own examples and on what Okta and
 * Entra ID send, its refusals (always invalidFilter, never a TypeError) and limits; then the
 * compiled SQL run against a real database (PostgreSQL with TEST_DATABASE_URL, PGlite without),
 * so what a filter returns is checked row by row, injection-shaped values included.
 */
import fc from 'fast-check';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createUser } from '../../src/accounts/users.js';
import { createDirectory } from '../../src/directory/directories.js';
import { groupFilterSql, parseFilter, parsePatchPath, userFilterSql } from '../../src/directory/filter.js';
import { ScimError } from '../../src/directory/scim-errors.js';
import { BACKEND, createTestDatabase } from '../helpers/db.js';
import { createOrgFixture } from '../helpers/oauth.js';

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

const cmp = (attr: string, op: string, value: unknown, extra: object = {}) => ({ op, path: { attr, ...extra }, value });

describe('reading filters', () => {
  it('reads every example of RFC 7644 §3.4.2.2', () => {
    const examples = [
      'userName eq "bjensen"',
      'name.familyName co "O\'Malley"',
      'userName sw "J"',
      'urn:ietf:params:scim:schemas:core:2.0:User:userName sw "J"',
      'title pr',
      'meta.lastModified gt "2011-05-13T04:42:34Z"',
      'meta.lastModified ge "2011-05-13T04:42:34Z"',
      'meta.lastModified lt "2011-05-13T04:42:34Z"',
      'meta.lastModified le "2011-05-13T04:42:34Z"',
      'title pr and userType eq "Employee"',
      'title pr or userType eq "Intern"',
      'schemas eq "urn:ietf:params:scim:schemas:extension:enterprise:2.0:User"',
      'userType eq "Employee" and (emails co "example.com" or emails.value co "example.org")',
      'userType ne "Employee" and not (emails co "example.com" or emails.value co "example.org")',
      'userType eq "Employee" and (emails.type eq "work")',
      'userType eq "Employee" and emails[type eq "work" and value co "@example.com"]',
      'emails[type eq "work" and value co "@example.com"] or ims[type eq "xmpp" and value co "@foo.com"]',
    ];
    for (const f of examples) {
      expect(() => parseFilter(f), f).not.toThrow();
      expect(() => userFilterSql(f), f).not.toThrow();
    }
    expect(parseFilter('name.familyName co "O\'Malley"')).toEqual(cmp('name', 'co', "O'Malley", { sub: 'familyName' }));
    expect(parseFilter('urn:ietf:params:scim:schemas:core:2.0:User:userName sw "J"')).toEqual({ op: 'sw', path: { schema: 'urn:ietf:params:scim:schemas:core:2.0:User', attr: 'userName' }, value: 'J' });
  });

  it("reads Okta's and Entra ID's lookups", () => {
    // Okta: GET /Users?filter=userName eq "x@example.com" (its SCIM 2.0 reference, "Create Users").
    expect(parseFilter('userName eq "test.user@okta.local"')).toEqual(cmp('userName', 'eq', 'test.user@okta.local'));
    // Entra ID (learn.microsoft.com, "Develop and plan provisioning for a SCIM endpoint").
    expect(parseFilter('userName eq "Test_User_dfeef4c5-5681-4387-b016-bdf221e82081"')).toEqual(cmp('userName', 'eq', 'Test_User_dfeef4c5-5681-4387-b016-bdf221e82081'));
    expect(parseFilter('externalId eq "0a21f0f2-8d2a-4f8e-bf98-7363c4aed4ef"')).toEqual(cmp('externalId', 'eq', '0a21f0f2-8d2a-4f8e-bf98-7363c4aed4ef'));
    expect(parseFilter('displayName eq "Group1DisplayName"')).toEqual(cmp('displayName', 'eq', 'Group1DisplayName'));
    expect(() => groupFilterSql('displayName eq "Group1DisplayName"')).not.toThrow();
    // Entra ID's membership check: GET /Groups/{id}?excludedAttributes=members&filter=members[value eq "..."]
    expect(() => groupFilterSql('members[value eq "f648f8d5ea4e4cd38e9c"]')).not.toThrow();
  });

  it('binds and tighter than or, not tighter than and; operators and names in any case', () => {
    const a = cmp('a', 'eq', 1);
    const b = cmp('b', 'eq', 2);
    const c = cmp('c', 'eq', 3);
    expect(parseFilter('a eq 1 or b eq 2 and c eq 3')).toEqual({ op: 'or', left: a, right: { op: 'and', left: b, right: c } });
    expect(parseFilter('a eq 1 and b eq 2 or c eq 3')).toEqual({ op: 'or', left: { op: 'and', left: a, right: b }, right: c });
    expect(parseFilter('(a eq 1 or b eq 2) and c eq 3')).toEqual({ op: 'and', left: { op: 'or', left: a, right: b }, right: c });
    expect(parseFilter('not (a eq 1) and b eq 2')).toEqual({ op: 'and', left: { op: 'not', filter: a }, right: b });
    expect(parseFilter('a EQ 1 AND b Eq 2 oR NOT (c eq 3)')).toEqual({ op: 'or', left: { op: 'and', left: a, right: b }, right: { op: 'not', filter: c } });
    expect(parseFilter('active eq True')).toEqual(cmp('active', 'eq', true));
    expect(parseFilter('x gt -1.5e2')).toEqual(cmp('x', 'gt', -150));
    expect(parseFilter('title eq NULL')).toEqual(cmp('title', 'eq', null));
    expect(() => userFilterSql('USERNAME EQ "a" and EMAILS.VALUE co "b" and Meta.LastModified GT "2020-01-01T00:00:00Z"')).not.toThrow();
  });

  it('reads JSON string escapes as JSON does', () => {
    expect((parseFilter(String.raw`title eq "a\\b"`) as { value: string }).value).toBe('a\\b');
    expect((parseFilter(String.raw`title eq "a\\"`) as { value: string }).value).toBe('a\\');
    expect((parseFilter(String.raw`title eq "say \"hi\""`) as { value: string }).value).toBe('say "hi"');
    expect((parseFilter(String.raw`title eq "\u0041\n"`) as { value: string }).value).toBe('A\n');
    expect((parseFilter('title eq "a ] ) ( [ or and"') as { value: string }).value).toBe('a ] ) ( [ or and');
  });

  it('reads value paths, a sub-attribute after one becoming part of the same element', () => {
    expect(parseFilter('emails[type eq "work"]')).toEqual({ op: '[]', path: { attr: 'emails' }, filter: cmp('type', 'eq', 'work') });
    // emails[type eq "work"].value eq "x": one element must be both (not two different ones).
    expect(parseFilter('emails[type eq "work"].value eq "x"')).toEqual({ op: '[]', path: { attr: 'emails' }, filter: { op: 'and', left: cmp('type', 'eq', 'work'), right: cmp('value', 'eq', 'x') } });
    expect(parseFilter(`${ENTERPRISE}:employeeNumber eq "701984"`)).toEqual({ op: 'eq', path: { schema: ENTERPRISE, attr: 'employeeNumber' }, value: '701984' });
    expect(parseFilter(`${ENTERPRISE}:manager.value eq "26118915-6090-4610-87e4-49d8ca9f808d"`)).toEqual({ op: 'eq', path: { schema: ENTERPRISE, attr: 'manager', sub: 'value' }, value: '26118915-6090-4610-87e4-49d8ca9f808d' });
  });

  it('reads PATCH paths', () => {
    expect(parsePatchPath('emails[type eq "work"].value')).toEqual({ path: { attr: 'emails' }, filter: cmp('type', 'eq', 'work'), sub: 'value' });
    expect(parsePatchPath('members[value eq "2819c223-7f76-453a-919d-413861904646"]')).toEqual({ path: { attr: 'members' }, filter: cmp('value', 'eq', '2819c223-7f76-453a-919d-413861904646') });
    expect(parsePatchPath('name.givenName')).toEqual({ path: { attr: 'name', sub: 'givenName' } });
    expect(scimError(() => parsePatchPath('emails[type eq "work"')).scimType).toBe('invalidPath');
    expect(scimError(() => parsePatchPath('a.b.c')).scimType).toBe('invalidPath');
  });

  it('refuses malformed filters with invalidFilter', () => {
    const bad = [
      '',
      '   ',
      '(userName eq "a"',
      'userName eq "a")',
      'userName eq "a',
      'userName eq a',
      'userName xx "a"',
      'userName eq',
      'userName',
      'userName eq "a" userName eq "b"',
      'userName eq "a" and',
      'or userName eq "a"',
      'emails[type eq "work"',
      'emails[type eq "work"]]',
      'emails[type[value eq "x"] eq "y"]',
      'emails[type eq "work"].',
      'name.givenName.x eq "a"',
      'userName eq "\u0001"',
      'userName eq "\\x41"',
      'userName eq 01',
      'userName ~ "a"',
      "userName eq 'a'",
      'a eq 1 ) or (',
    ];
    for (const f of bad) {
      const err = scimError(() => parseFilter(f));
      expect({ f, status: err.statusCode, type: err.scimType }).toEqual({ f, status: 400, type: 'invalidFilter' });
    }
    expect(scimError(() => parseFilter(42 as unknown as string)).scimType).toBe('invalidFilter');
  });

  it('refuses unknown attributes and comparisons that make no sense', () => {
    const bad = [
      'nosuch eq "a"',
      'name.nosuch eq "a"',
      'emails.nosuch eq "a"',
      'emails[nosuch eq "a"]',
      'urn:example:ext:1.0:User:thing eq "a"',
      `${ENTERPRISE}:nosuch eq "a"`,
      'urn:ietf:params:scim:schemas:core:2.0:Group:displayName eq "a"',
      'groups eq "x"',
      'active gt true',
      'active eq "maybe"',
      'meta.lastModified gt "yesterday"',
      'meta.lastModified gt 5',
      'meta.created co "2020"',
      'meta.version eq "1"',
      'title gt null',
      'name eq "x"',
      'userName[value eq "x"]',
    ];
    for (const f of bad) {
      const err = scimError(() => userFilterSql(f));
      expect({ f, type: err.scimType }).toEqual({ f, type: 'invalidFilter' });
    }
    for (const f of ['userName eq "a"', 'members.display eq "a"', 'emails co "a"']) expect(scimError(() => groupFilterSql(f)).scimType).toBe('invalidFilter');
  });

  it('limits length, nesting and comparisons', () => {
    expect(scimError(() => parseFilter(`userName eq "${'a'.repeat(2000)}"`)).description).toMatch(/2000/);
    const deep = (n: number) => `${'('.repeat(n)}userName eq "a"${')'.repeat(n)}`;
    expect(() => parseFilter(deep(10))).not.toThrow();
    expect(scimError(() => parseFilter(deep(11))).scimType).toBe('invalidFilter');
    expect(scimError(() => parseFilter(`${'not '.repeat(11)}(userName eq "a")`)).scimType).toBe('invalidFilter');
    // Far deeper than the call stack would allow: still a 400, not a RangeError.
    expect(scimError(() => parseFilter(deep(900))).scimType).toBe('invalidFilter');
    const many = (n: number) => Array.from({ length: n }, (_, i) => `userName eq "${i}"`).join(' or ');
    expect(() => parseFilter(many(50))).not.toThrow();
    expect(scimError(() => parseFilter(many(51))).description).toMatch(/50 comparisons/);
  });

  it('throws nothing but ScimError, whatever the text', () => {
    const pieces = ['userName', 'emails', '[', ']', '(', ')', '.', 'value', 'eq', 'co', 'pr', 'and', 'or', 'not', '"x"', '"', '\\', '1', 'true', 'null', ' ', 'urn:a:b', ':', "'", '-', '$ref'];
    const soup = fc.array(fc.constantFrom(...pieces), { maxLength: 20 }).map((p) => p.join(' '));
    fc.assert(
      fc.property(fc.oneof(fc.string({ maxLength: 60 }), soup), (text) => {
        for (const compile of [userFilterSql, groupFilterSql]) {
          try {
            compile(text);
          } catch (err) {
            if (!(err instanceof ScimError) || err.statusCode !== 400) throw err;
          }
        }
      }),
      { numRuns: 2000 },
    );
  });
});

describe(`filters run on ${BACKEND}`, () => {
  let t: Awaited<ReturnType<typeof createTestDatabase>>;
  let directoryId: number;
  let otherDirectoryId: number;
  const ids: Record<string, string> = {};
  const groupIds: Record<string, string> = {};

  beforeAll(async () => {
    t = await createTestDatabase();
    const db = t.handle.db;
    const org = await createOrgFixture(db);
    directoryId = (await createDirectory(db, org.organizationId, { name: 'Okta' })).directory.id;
    otherDirectoryId = (await createDirectory(db, org.organizationId, { name: 'Entra' })).directory.id;
    const rows: Array<{ key: string; userName: string; externalId: string | null; displayName: string | null; active: boolean; updated: string; resource: object; directory?: number }> = [
      {
        key: 'babs',
        userName: 'BJensen@Example.com',
        externalId: 'ext-1',
        displayName: 'Barbara Jensen',
        active: true,
        updated: '2024-01-01T00:00:00Z',
        resource: {
          name: { givenName: 'Barbara', familyName: 'Jensen', formatted: 'Ms. Barbara J Jensen III' },
          emails: [
            { value: 'bjensen@example.com', type: 'work', primary: true },
            { value: 'babs@jensen.org', type: 'home' },
          ],
          title: '100% sure',
          userType: 'Employee',
          schemas: ['urn:ietf:params:scim:schemas:core:2.0:User', ENTERPRISE],
          [ENTERPRISE]: { employeeNumber: '701984', department: 'Tour Operations', manager: { value: 'mgr-1', displayName: 'John Smith' } },
        },
      },
      {
        key: 'john',
        userName: 'jomalley@example.com',
        externalId: 'EXT-1',
        displayName: "John O'Malley",
        active: false,
        updated: '2025-06-01T00:00:00Z',
        resource: {
          name: { givenName: 'John', familyName: "O'Malley" },
          // Entra's "True" string, as a client may have stored it.
          emails: [{ value: 'john@work.example.org', type: 'Work', primary: 'True' }],
          title: '100 percent',
          userType: 'Intern',
        },
      },
      {
        key: 'odd',
        userName: "x' or 1=1 --",
        externalId: null,
        displayName: null,
        active: true,
        updated: '2026-01-01T00:00:00Z',
        resource: { emails: 'not-an-array', title: 'a_b', phoneNumbers: [] },
      },
      {
        key: 'under',
        userName: 'under_score@example.com',
        externalId: null,
        displayName: 'Under Score',
        active: true,
        updated: '2026-02-01T00:00:00Z',
        resource: { title: 'axb', phoneNumbers: [{ value: '+1 555 0100', type: 'mobile' }], [ENTERPRISE]: { employeeNumber: '12' } },
      },
      // Another directory's user matches nothing here: the caller adds the directory condition.
      { key: 'other', userName: 'bjensen@example.com', externalId: 'ext-1', displayName: 'Barbara Jensen', active: true, updated: '2024-01-01T00:00:00Z', resource: {}, directory: -1 },
    ];
    for (const [i, r] of rows.entries()) {
      const user = await createUser(db, { email: `filter-${i}-${Date.now()}@example.com`, password: 'filter-password-1' });
      const inserted = await db
        .insertInto('directory_users')
        .values({
          directory_id: r.directory === -1 ? otherDirectoryId : directoryId,
          user_id: user.id,
          user_name: r.userName,
          external_id: r.externalId,
          display_name: r.displayName,
          active: r.active,
          resource: JSON.stringify({ userName: r.userName, ...r.resource }),
          role: 'member',
          updated_at: sql<Date>`${r.updated}::timestamptz`,
        })
        .returning('id')
        .executeTakeFirstOrThrow();
      ids[r.key] = inserted.id;
    }
    for (const [key, displayName, externalId, members] of [
      ['eng', 'Engineering', 'g-1', ['babs', 'john']],
      ['sales', 'Sales', null, []],
      ['ops', 'Ops_Team', 'G-1', ['odd']],
    ] as const) {
      const g = await db.insertInto('directory_groups').values({ directory_id: directoryId, display_name: displayName, external_id: externalId, updated_at: sql<Date>`now()` }).returning('id').executeTakeFirstOrThrow();
      groupIds[key] = g.id;
      for (const m of members) await db.insertInto('directory_group_members').values({ group_id: g.id, user_id: ids[m]! }).execute();
    }
  });
  afterAll(async () => {
    await t?.close();
  });

  async function users(filter: string): Promise<string[]> {
    const rows = await t.handle.db.selectFrom('directory_users').select('id').where('directory_id', '=', directoryId).where(userFilterSql(filter)).orderBy('seq').execute();
    const names = Object.fromEntries(Object.entries(ids).map(([k, v]) => [v, k]));
    return rows.map((r) => names[r.id]!);
  }

  async function groups(filter: string): Promise<string[]> {
    const rows = await t.handle.db.selectFrom('directory_groups').select('id').where('directory_id', '=', directoryId).where(groupFilterSql(filter)).orderBy('seq').execute();
    const names = Object.fromEntries(Object.entries(groupIds).map(([k, v]) => [v, k]));
    return rows.map((r) => names[r.id]!);
  }

  it('userName compares without case; externalId exactly; displayName without case', async () => {
    expect(await users('userName eq "bjensen@example.com"')).toEqual(['babs']);
    expect(await users('USERNAME Eq "BJENSEN@EXAMPLE.COM"')).toEqual(['babs']);
    expect(await users('urn:ietf:params:scim:schemas:core:2.0:User:userName sw "bj"')).toEqual(['babs']);
    expect(await users('externalId eq "ext-1"')).toEqual(['babs']);
    expect(await users('externalId eq "EXT-1"')).toEqual(['john']);
    expect(await users('displayName eq "barbara jensen"')).toEqual(['babs']);
    expect(await users('userName ne "bjensen@example.com"')).toEqual(['john', 'odd', 'under']);
  });

  it('uses the (directory_id, lower(user_name)) index for userName eq', async () => {
    const compiled = t.handle.db.selectFrom('directory_users').select('id').where('directory_id', '=', directoryId).where(userFilterSql('userName eq "a"')).compile();
    expect(compiled.sql).toContain('lower("directory_users"."user_name") = lower($2)');
    expect(compiled.parameters).toEqual([directoryId, 'a']);
    const plan = await t.handle.db.transaction().execute(async (trx) => {
      // Four rows would be read whole anyway: ask the planner what it would do with many.
      await sql`set local enable_seqscan = off`.execute(trx);
      return trx.selectFrom('directory_users').select('id').where('directory_id', '=', directoryId).where(userFilterSql('userName eq "BJensen@example.com"')).explain();
    });
    expect(JSON.stringify(plan)).toContain('directory_users_user_name_key');
  });

  it("uses migration 0028's indexes for userName sw, active, and emails compared by value", async () => {
    // A few rows would be read whole anyway: ask the planner what it would do with many. (With
    // the directory's condition too, any index led by directory_id looks as good for five rows.)
    const plan = async (filter: string, inDirectory = true) =>
      JSON.stringify(
        await t.handle.db.transaction().execute(async (trx) => {
          await sql`set local enable_seqscan = off`.execute(trx);
          const q = trx.selectFrom('directory_users').select('id').where(userFilterSql(filter));
          return (inDirectory ? q.where('directory_id', '=', directoryId) : q).explain();
        }),
      );
    expect(await plan('userName sw "BJen"')).toContain('directory_users_user_name_key');
    expect(await plan('active eq false')).toContain('directory_users_active_idx');
    for (const f of ['emails[type eq "work"].value co "Jensen"', 'emails.value eq "bjensen@example.com"', 'emails sw "bje"', 'emails[value ew "example.com" and type eq "work"]']) {
      expect(await plan(f, false), f).toContain('directory_users_emails_idx');
    }
    // Shorter than a trigram, or one of several texts that may match: compared row by row only.
    const compiled = (f: string) => t.handle.db.selectFrom('directory_users').select('id').where(userFilterSql(f)).compile().sql;
    expect(compiled('emails co "ab"')).not.toContain('directory_user_emails');
    expect(compiled('emails[value co "abc" or value co "def"]')).not.toContain('directory_user_emails');
    expect(compiled('emails[type eq "work"].value co "abc"')).toContain('directory_user_emails');
  });

  it("never answers otherwise for the emails index's test: any case, %, _, \\, line breaks, non-ASCII letters", async () => {
    const text = fc.string({ unit: fc.constantFrom('a', 'B', 'é', 'É', 'İ', 'ß', 'Σ', '%', '_', '\\', '\n', '@', '.', ' ', '1'), minLength: 3, maxLength: 6 });
    const element = fc.record({ value: fc.oneof(text, fc.constant(42), fc.constant(null)), type: fc.constantFrom('work', 'home') });
    const resource = fc.oneof(fc.array(element, { maxLength: 3 }).map((emails) => ({ emails })), fc.constant({ emails: 'not-an-array' }), fc.constant({}));
    await fc.assert(
      fc.asyncProperty(resource, text, fc.constantFrom('eq', 'co', 'sw', 'ew'), async (r, value, op) => {
        const v = JSON.stringify(value);
        // With the index's test beside the comparison, and (an `or` of the same comparison) without it.
        const indexed = userFilterSql(`emails[type eq "work"].value ${op} ${v}`);
        const plain = userFilterSql(`emails[type eq "work" and (value ${op} ${v} or value ${op} ${v})]`);
        const { rows } = await sql<{ indexed: boolean; plain: boolean }>`select ${indexed} as indexed, ${plain} as plain
          from (select cast(${JSON.stringify(r)} as jsonb) as resource) as directory_users`.execute(t.handle.db);
        expect(rows[0]!.indexed, JSON.stringify({ r, value, op })).toBe(rows[0]!.plain);
      }),
      { numRuns: 300 },
    );
  });

  it('takes an injection-shaped value as a value', async () => {
    const compiled = t.handle.db.selectFrom('directory_users').select('id').where(userFilterSql('userName eq "x\' or 1=1 --" or title co "\'; --"')).compile();
    expect(compiled.sql).not.toMatch(/1=1|--/);
    expect(compiled.parameters).toEqual(["x' or 1=1 --", "%'; --%"]);
    expect(await users('userName eq "x\' or 1=1 --"')).toEqual(['odd']);
    expect(await users('userName eq "nobody\' or \'1\'=\'1"')).toEqual([]);
    expect(await users('title eq "\\"); drop table directory_users; --"')).toEqual([]);
    expect(await users('userName pr')).toHaveLength(4);
  });

  it('id: a UUID in any case matches, anything else matches nothing without an SQL error', async () => {
    expect(await users(`id eq "${ids.john}"`)).toEqual(['john']);
    expect(await users(`id eq "${ids.john!.toUpperCase()}"`)).toEqual(['john']);
    expect(await users('id eq "not-a-uuid"')).toEqual([]);
    expect(await users('id eq 42')).toEqual([]);
    expect(await users('id ne "not-a-uuid"')).toEqual(['babs', 'john', 'odd', 'under']);
    expect(await users(`id sw "${ids.odd!.slice(0, 8)}"`)).toEqual(['odd']);
    expect(await groups(`id eq "${groupIds.sales}"`)).toEqual(['sales']);
    expect(await groups('id eq "sales"')).toEqual([]);
  });

  it('active is a boolean', async () => {
    expect(await users('active eq false')).toEqual(['john']);
    expect(await users('active eq true')).toEqual(['babs', 'odd', 'under']);
    expect(await users('active ne true')).toEqual(['john']);
    expect(await users('not (active eq true)')).toEqual(['john']);
  });

  it('emails: values, types, value paths, without case; anything but an array holds none', async () => {
    expect(await users('emails.value eq "BJENSEN@example.com"')).toEqual(['babs']);
    expect(await users('emails co "example.org"')).toEqual(['john']);
    expect(await users('emails.type eq "work"')).toEqual(['babs', 'john']);
    expect(await users('emails[type eq "work"].value ew "@example.com"')).toEqual(['babs']);
    // Two conditions on one element: babs's home address is not her work one.
    expect(await users('emails[type eq "home" and value co "example.com"]')).toEqual([]);
    expect(await users('emails[type eq "home"] and emails.value co "example.com"')).toEqual(['babs']);
    expect(await users('emails[type eq "work" and primary eq true]')).toEqual(['babs', 'john']);
    expect(await users('emails[primary eq false]')).toEqual([]);
    expect(await users('emails pr')).toEqual(['babs', 'john']);
    expect(await users('not (emails pr)')).toEqual(['odd', 'under']);
    expect(await users('phoneNumbers pr')).toEqual(['under']);
    expect(await users('phoneNumbers[type eq "mobile"].value sw "+1"')).toEqual(['under']);
    expect(await users('emails eq null')).toEqual(['odd', 'under']);
  });

  it('RFC 7644 examples with emails and not', async () => {
    expect(await users('userType eq "Employee" and (emails co "example.com" or emails.value co "example.org")')).toEqual(['babs']);
    expect(await users('userType ne "Employee" and not (emails co "example.com" or emails.value co "example.org")')).toEqual(['odd', 'under']);
    expect(await users('userType eq "Employee" and emails[type eq "work" and value co "@example.com"]')).toEqual(['babs']);
    expect(await users('title pr and userType eq "Employee"')).toEqual(['babs']);
    expect(await users('title pr or userType eq "Intern"')).toEqual(['babs', 'john', 'odd', 'under']);
    expect(await users(`schemas eq "${ENTERPRISE}"`)).toEqual(['babs']);
  });

  it('co, sw and ew take % and _ literally', async () => {
    expect(await users('title co "100%"')).toEqual(['babs']);
    expect(await users('title sw "100%"')).toEqual(['babs']);
    expect(await users('title co "%"')).toEqual(['babs']);
    expect(await users('title co "a_b"')).toEqual(['odd']);
    expect(await users('title ew "_b"')).toEqual(['odd']);
    expect(await users('title co "_"')).toEqual(['odd']);
    expect(await users('userName co "_score"')).toEqual(['under']);
    expect(await users('title co "\\\\"')).toEqual([]);
    expect(await groups('displayName co "_"')).toEqual(['ops']);
  });

  it('name, title, the enterprise extension with or without its URN', async () => {
    expect(await users('name.familyName co "O\'Malley"')).toEqual(['john']);
    expect(await users('name.givenName eq "barbara"')).toEqual(['babs']);
    expect(await users('name.formatted pr')).toEqual(['babs']);
    expect(await users('name pr')).toEqual(['babs', 'john']);
    expect(await users(`${ENTERPRISE}:employeeNumber eq "701984"`)).toEqual(['babs']);
    expect(await users('employeeNumber pr')).toEqual(['babs', 'under']);
    expect(await users(`${ENTERPRISE}:department sw "tour"`)).toEqual(['babs']);
    expect(await users(`${ENTERPRISE}:manager.value eq "mgr-1"`)).toEqual(['babs']);
    expect(await users('title gt "a"')).toEqual(['odd', 'under']);
    expect(await users('not (title eq "axb")')).toEqual(['babs', 'john', 'odd']);
  });

  it('meta.created and meta.lastModified compare as timestamps', async () => {
    expect(await users('meta.lastModified gt "2025-01-01T00:00:00Z"')).toEqual(['john', 'odd', 'under']);
    expect(await users('meta.lastModified ge "2025-06-01T00:00:00Z"')).toEqual(['john', 'odd', 'under']);
    expect(await users('meta.lastModified lt "2025-06-01T02:00:00+02:00"')).toEqual(['babs']);
    expect(await users('meta.lastModified le "2024-01-01"')).toEqual(['babs']);
    expect(await users('meta.lastModified eq "2026-01-01T00:00:00.000Z"')).toEqual(['odd']);
    expect(await users('meta.created gt "2000-01-01T00:00:00Z"')).toHaveLength(4);
    expect(await groups('meta.lastModified gt "2000-01-01T00:00:00Z"')).toEqual(['eng', 'sales', 'ops']);
  });

  it('groups: displayName without case, externalId exactly, members by value', async () => {
    expect(await groups('displayName eq "engineering"')).toEqual(['eng']);
    expect(await groups('externalId eq "g-1"')).toEqual(['eng']);
    expect(await groups(`members[value eq "${ids.john}"]`)).toEqual(['eng']);
    expect(await groups(`members[value eq "${ids.odd!.toUpperCase()}"]`)).toEqual(['ops']);
    expect(await groups(`members.value eq "${ids.babs}"`)).toEqual(['eng']);
    expect(await groups(`members eq "${ids.odd}"`)).toEqual(['ops']);
    expect(await groups('members[value eq "f648f8d5ea4e4cd38e9c"]')).toEqual([]);
    expect(await groups('members pr')).toEqual(['eng', 'ops']);
    expect(await groups('not (members pr)')).toEqual(['sales']);
    expect(await groups(`displayName eq "Engineering" and members[value eq "${ids.odd}"]`)).toEqual([]);
    expect(await groups(`urn:ietf:params:scim:schemas:core:2.0:Group:displayName sw "s"`)).toEqual(['sales']);
  });
});
