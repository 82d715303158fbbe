/**
 * `orgauth client`: the clients that registered themselves (RFC 7591 dynamic registration, client
 * ID metadata documents). They belong to no organization, so no organization's administrators
 * manage them; the operator sees and removes them here.
 */
import { applicationOut } from '../api/applications.js';
import { decodeCursor } from '../api/pagination.js';
import { findApplicationByClientId } from '../oauth/models/applications.js';
import { deleteRegisteredClient } from '../oauth/models/registrations.js';
import { NotFoundError } from '../errors.js';
import { SELF_REGISTRATIONS } from '../db/schema.js';
import { listed, optionalString, PAGE_OPTIONS, PAGE_USAGE, required, type Command } from './shared.js';

export const clientCommands: Record<string, Command> = {
  'client list': {
    usage: `orgauth client list ${PAGE_USAGE}`,
    summary: 'list the clients that registered themselves (dynamic registration, metadata documents), oldest first',
    options: { ...PAGE_OPTIONS },
    run: async ({ db }, v) =>
      listed(
        v,
        (limit) =>
          db
            .selectFrom('applications')
            .selectAll()
            .where('registration', 'in', SELF_REGISTRATIONS)
            // Self-registered clients are public (applications_registered_public_check).
            .$narrowType<{ type: 'public' | 'private' }>()
            .where('id', '>', decodeCursor(optionalString(v, 'cursor')))
            .orderBy('id')
            .limit(limit)
            .execute(),
        (a) => a.id,
        (a) => ({
          ...applicationOut(a),
          registration: a.registration,
          token_endpoint_auth_method: a.token_endpoint_auth_method,
          grant_types: a.grant_types,
          first_used_at: a.first_used_at?.toISOString() ?? null,
        }),
        [
          ['CLIENT_ID', (a) => a.client_id],
          ['REGISTRATION', (a) => a.registration],
          ['NAME', (a) => a.name],
          ['REDIRECT_URIS', (a) => a.redirect_uris.join(' ')],
          ['USED', (a) => a.first_used_at ?? 'never'],
        ],
      ),
  },

  'client delete': {
    usage: 'orgauth client delete --client-id ID',
    summary: 'delete a self-registered client after revoking its grants in every organization',
    options: { 'client-id': { type: 'string' } },
    run: async ({ db }, v) => {
      const clientId = required(v, 'client-id');
      const application = await findApplicationByClientId(db, clientId);
      if (!application || !(SELF_REGISTRATIONS as readonly string[]).includes(application.registration)) throw new NotFoundError(`no self-registered client with client_id ${clientId}`);
      await deleteRegisteredClient(db, application);
      return { json: { client_id: application.client_id, deleted: true }, text: `deleted client ${application.client_id} "${application.name}"` };
    },
  },
};
