/**
 * The refresh statement reaches the grant by its key from the refresh token, whatever the
 * statistics say. Planned with its values (unnamed statements, as behind PgBouncer) while the
 * statistics were older than an application's grants, it once read the grant through
 * grants_application_id_idx and filtered all of that application's grants by id on every
 * refresh (the bench's large database through PgBouncer: 505 instead of 1,403 req/s).
 */
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOrganization } from '../../src/accounts/organizations.js';
import { createUser } from '../../src/accounts/users.js';
import type { DB } from '../../src/db/connect.js';
import type { Application } from '../../src/db/schema.js';
import { createApplication } from '../../src/oauth/models/applications.js';
import { refreshToken } from '../../src/oauth/grants/refresh-token.js';
import type { TokenContext } from '../../src/oauth/grants/token-response.js';
import { testConfig } from '../helpers/app.js';
import { BACKEND, createTestDatabase } from '../helpers/db.js';
import { explain, firstQueryOf, nodesOf } from '../helpers/plans.js';

let t: Awaited<ReturnType<typeof createTestDatabase>>;
beforeAll(async () => {
  t = await createTestDatabase();
});
afterAll(() => t.close());

describe(`the refresh statement's plan on ${BACKEND}`, () => {
  it('reads the grant by its key, even when the statistics think the application has no grants', async () => {
    const db = t.handle.db;
    const user = await createUser(db, { email: `plans-${process.pid}@example.com`, password: 'plans-password-1' });
    const org = await createOrganization(db, { name: 'Plans', ownerUserId: user.id });
    const app = async (name: string) => {
      const created = await createApplication(db, { organizationId: org.id, type: 'public', name, redirectUris: ['https://client.example.com/cb'] });
      return db.selectFrom('applications').selectAll().where('client_id', '=', created.client_id).executeTakeFirstOrThrow();
    };
    const bulk = await app('Bulk');
    const grants = (application: Application, n: number) =>
      sql`insert into grants (organization_id, application_id, user_id, scopes) select ${org.id}, ${application.id}, ${user.id}, '{contacts.read}' from generate_series(1, ${n})`.execute(db);
    await grants(bulk, 50_000);
    await sql`analyze grants`.execute(db);
    // Fewer than autoanalyze's threshold (10% of the table): the statistics never hear of them.
    const late = await app('Late');
    await grants(late, 4_000);

    const ctx = { config: testConfig(), keys: { signingKey: async () => ({}) } };
    const compiled = await firstQueryOf(db, (capturing) =>
      refreshToken.handle({ ...ctx, db: capturing } as unknown as TokenContext, { application: late, method: 'client_secret_basic' }, { grant_type: 'refresh_token', refresh_token: 'x'.repeat(43) }, { dpopJkt: null }),
    );
    expect(compiled.sql).toContain('update refresh_tokens');
    const plan = await db.transaction().execute(async (trx) => {
      // As a large table would be planned: no sequential scans.
      await sql`set local enable_seqscan = off`.execute(trx);
      return explain(trx, compiled);
    });
    const grantReads = nodesOf(plan).filter((n) => n['Relation Name'] === 'grants' && n['Node Type'].includes('Scan'));
    expect(grantReads.length, JSON.stringify(plan)).toBeGreaterThan(0);
    for (const read of grantReads) expect(read['Index Name'], JSON.stringify(plan)).not.toBe('grants_application_id_idx');
  });
});
