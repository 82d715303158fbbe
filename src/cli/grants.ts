import { grantOut } from '../api/grants.js';
import { decodeDescendingCursor } from '../api/pagination.js';
import { NotFoundError } from '../errors.js';
import { parseCanonicalId } from '../oauth/helpers/params.js';
import { listLiveGrants, revokeGrant } from '../oauth/models/grants.js';
import { listed, optionalString, orgId, PAGE_OPTIONS, PAGE_USAGE, required, UsageError, type Command } from './shared.js';

export const grantCommands: Record<string, Command> = {
  'grant list': {
    usage: `orgauth grant list --org ID ${PAGE_USAGE}`,
    summary: "list an organization's connected apps (live grants), newest first",
    options: { org: { type: 'string' }, ...PAGE_OPTIONS },
    run: async ({ db }, v) => {
      const organizationId = orgId(v);
      return listed(
        v,
        (limit) => listLiveGrants(db, organizationId, { beforeId: decodeDescendingCursor(optionalString(v, 'cursor')), limit }),
        (g) => g.id,
        grantOut,
        [
          ['ID', (g) => String(g.id)],
          ['APPLICATION', (g) => `${g.application.name} (${g.application.client_id})`],
          ['AUTHORIZED BY', (g) => g.user?.email ?? 'the application itself'],
          ['SCOPES', (g) => g.scopes.join(' ')],
          ['LAST USED', (g) => g.last_used_at ?? 'never'],
        ],
      );
    },
  },

  'grant revoke': {
    usage: 'orgauth grant revoke --id ID',
    summary: "revoke a grant: its tokens stop working on every instance within a second",
    options: { id: { type: 'string' } },
    run: async ({ db }, v) => {
      const raw = required(v, 'id');
      const id = parseCanonicalId(raw);
      if (id === undefined) throw new UsageError('--id must be a positive integer');
      if (!(await revokeGrant(db, id, 'revoked_by_admin'))) throw new NotFoundError(`no live grant with id ${raw}`);
      return { json: { id, revoked: true }, text: `revoked grant ${id}` };
    },
  },
};
