import { addActivity, utcDay } from '../activity.js';
import { issueClientToken } from '../oauth/grants/token-response.js';
import { requiresDpop } from '../oauth/helpers/fapi.js';
import { UnauthorizedClientError } from '../oauth/errors.js';
import { grantableScopes } from '../oauth/helpers/scopes.js';
import { ClientGrants } from '../oauth/models/client-grants.js';
import { markClientUsed } from '../oauth/models/registrations.js';
import { KeyStore } from '../oauth/models/key-store.js';
import { ensureSigningKey } from '../oauth/models/signing-keys.js';
import { applicationByClientId, optionalString, required, type Command } from './shared.js';

export const tokenCommands: Record<string, Command> = {
  'token create': {
    usage: 'orgauth token create --client-id ID [--scopes "contacts.read tasks.read"]',
    summary: "issue a private application's access token for its organization (as client_credentials does)",
    options: { 'client-id': { type: 'string' }, scopes: { type: 'string' } },
    run: async ({ db, config }, v) => {
      const application = await applicationByClientId(db, required(v, 'client-id'));
      if (application.type !== 'private') throw new UnauthorizedClientError('tokens are issued directly only to private applications');
      if (application.disabled) throw new UnauthorizedClientError('the application is disabled');
      // Its tokens must be bound to a key only the application holds: none can be made here.
      if (requiresDpop(application)) throw new UnauthorizedClientError("the application's tokens are DPoP-bound: it gets them itself, with client credentials and a DPoP proof");
      const scopes = grantableScopes(optionalString(v, 'scopes'), application.scopes);
      await ensureSigningKey(db, { alg: config.signingAlg, secretKey: config.secretKey });
      const response = await issueClientToken({ db, keys: new KeyStore(db, config), config, clientGrants: new ClientGrants(db) }, application, scopes);
      // The CLI runs beside the servers: it adds its one token to the Overview's counts itself.
      // Best effort: the token is issued, and printed whatever happens to these two.
      await addActivity(db, [{ organizationId: response.organization_id, metric: 'tokens_cli', day: utcDay(), count: 1 }]).catch(() => {});
      await markClientUsed(db, application)?.catch(() => {});
      return {
        json: response,
        text: [
          `access token for organization ${response.organization_id} "${response.organization_name}", scopes ${response.scope}, valid ${response.expires_in} s:`,
          response.access_token,
        ].join('\n'),
      };
    },
  },
};
