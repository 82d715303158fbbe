/**
 * `orgauth org setup-link ...`: links that let a customer's IT admin set up an organization's
 * domains, SSO connections and directories without becoming a member (accounts/setup-links.ts).
 * The operator makes them (no creator: such a link lasts until it expires or is revoked, whoever
 * the owners are); the URL is printed once, by the command that makes the link.
 */
import { getOrganization } from '../accounts/organizations.js';
import {
  createSetupLink,
  listSetupLinks,
  parseLifetime,
  revokeSetupLink,
  SETUP_FEATURES,
  type SetupLinkView,
  setupLinkUrl,
} from '../accounts/setup-links.js';
import { parseCanonicalId } from '../oauth/helpers/params.js';
import { optionalString, orgId, repeated, required, table, type Command, UsageError } from './shared.js';

const linkOut = (l: SetupLinkView) => ({
  id: l.id,
  organization_id: l.organization_id,
  features: l.features,
  created_by: l.created_by_email,
  created_at: l.created_at.toISOString(),
  expires_at: l.expires_at.toISOString(),
  last_used_at: l.last_used_at?.toISOString() ?? null,
});

export const setupLinkCommands: Record<string, Command> = {
  'org setup-link': {
    usage: `orgauth org setup-link --org ID --for ${SETUP_FEATURES.join('|')} [--for ...] [--expires 7d]`,
    summary: "make a link for a customer's IT admin to set up the organization's domains, SSO or directories (printed once)",
    options: { org: { type: 'string' }, for: { type: 'string', multiple: true }, expires: { type: 'string' } },
    run: async ({ db, config }, v) => {
      const organization = await getOrganization(db, orgId(v));
      const features = repeated(v, 'for');
      if (features.length === 0) throw new UsageError(`--for is required (${SETUP_FEATURES.join(', ')}; repeat it for several)`);
      const expires = optionalString(v, 'expires');
      const lifetime = expires === undefined ? undefined : parseLifetime(expires);
      if (expires !== undefined && lifetime === undefined) throw new UsageError('--expires takes a number of days or hours: 7d, 36h (at most 30d)');
      const { link, token } = await createSetupLink(db, organization.id, { features, expires_in: lifetime }, { userId: null });
      const url = setupLinkUrl(config.issuer, token);
      return {
        json: { ...linkOut(link), url },
        text: [
          `setup link ${link.id} for organization ${organization.id} "${organization.name}": ${link.features.join(', ')}, until ${link.expires_at.toISOString()}`,
          url,
          `(the link is shown only now: send it to the person who sets these up; \`orgauth org setup-link revoke --org ${organization.id} --id ${link.id}\` ends it)`,
        ].join('\n'),
      };
    },
  },

  'org setup-link list': {
    usage: 'orgauth org setup-link list --org ID',
    summary: "list an organization's live setup links (never their URLs)",
    options: { org: { type: 'string' } },
    run: async ({ db }, v) => {
      const organization = await getOrganization(db, orgId(v));
      const links = (await listSetupLinks(db, organization.id)).map(linkOut);
      const rows = links.map((l) => [String(l.id), l.features.join(','), l.expires_at, l.created_by ?? '(operator)', l.last_used_at ?? 'never']);
      return { json: { data: links }, text: links.length === 0 ? '(none)' : table(['ID', 'FEATURES', 'EXPIRES', 'CREATED BY', 'LAST USED'], rows) };
    },
  },

  'org setup-link revoke': {
    usage: 'orgauth org setup-link revoke --org ID --id N',
    summary: 'end a setup link at once',
    options: { org: { type: 'string' }, id: { type: 'string' } },
    run: async ({ db }, v) => {
      const organization = await getOrganization(db, orgId(v));
      const id = parseCanonicalId(required(v, 'id'));
      if (id === undefined) throw new UsageError('--id must be a positive integer');
      await revokeSetupLink(db, organization.id, id);
      return { json: { organization_id: organization.id, id, revoked: true }, text: `revoked setup link ${id}` };
    },
  },
};
