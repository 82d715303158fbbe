/**
 * `orgauth domain ...`: the email domains an organization claims for single sign-on
 * (src/sso/domains.ts). A claim is pending until the TXT record `_orgauth-challenge.<domain>`
 * holds its token and `domain verify` finds it, through DNS_SERVERS or the system's resolvers.
 * The operator acts (no actor in the audit log), as with every command.
 */
import { getOrganization } from '../accounts/organizations.js';
import { domainOut } from '../api/domains.js';
import type { DB } from '../db/connect.js';
import { addDomain, deleteDomain, type DomainView, getDomain, listDomains, txtLookup, updateDomain, verifyDomain } from '../sso/domains.js';
import { orgId, required, table, type Command, UsageError, type Values, yesNo } from './shared.js';

/** --org, checked: an unknown organization is "not found" for every command alike. */
async function organizationOf(db: DB, values: Values): Promise<number> {
  return (await getOrganization(db, orgId(values))).id;
}

/** The record to publish, as a zone file line would have it. */
const record = (d: DomainView) => `${d.verification.name}  TXT  "${d.verification.value}"`;

function describe(d: DomainView): string {
  return [
    `domain:       ${d.domain}`,
    `state:        ${d.state}${d.verified_at ? ` (verified ${d.verified_at.toISOString()})` : ''}`,
    `sso_required: ${d.sso_required ? 'yes' : 'no'}`,
    `verification: ${record(d)}`,
  ].join('\n');
}

const ORG_DOMAIN = { org: { type: 'string' }, domain: { type: 'string' } } as const;

export const domainCommands: Record<string, Command> = {
  'domain add': {
    usage: 'orgauth domain add --org ID --domain D',
    summary: 'claim an email domain for single sign-on; prints the DNS TXT record that proves it is the organization’s',
    options: { ...ORG_DOMAIN },
    run: async ({ db }, v) => {
      const organizationId = await organizationOf(db, v);
      const d = await addDomain(db, organizationId, { domain: required(v, 'domain') });
      return {
        json: domainOut(d),
        text: [
          `claimed ${d.domain} for organization ${organizationId} (pending)`,
          'publish this DNS record at the domain, then run',
          `\`orgauth domain verify --org ${organizationId} --domain ${d.domain}\`:`,
          `  ${record(d)}`,
        ].join('\n'),
      };
    },
  },

  'domain list': {
    usage: 'orgauth domain list --org ID',
    summary: "list an organization's domains, pending and verified",
    options: { org: { type: 'string' } },
    run: async ({ db }, v) => {
      const domains = await listDomains(db, await organizationOf(db, v));
      return {
        json: { data: domains.map(domainOut) },
        text:
          domains.length === 0
            ? '(none)'
            : table(['DOMAIN', 'STATE', 'SSO_REQUIRED', 'TXT RECORD'], domains.map((d) => [d.domain, d.state, d.sso_required ? 'yes' : 'no', `${d.verification.name} "${d.verification.value}"`])),
      };
    },
  },

  'domain show': {
    usage: 'orgauth domain show --org ID --domain D',
    summary: 'show a domain and its TXT record',
    options: { ...ORG_DOMAIN },
    run: async ({ db }, v) => {
      const d = await getDomain(db, await organizationOf(db, v), required(v, 'domain'));
      return { json: domainOut(d), text: describe(d) };
    },
  },

  'domain verify': {
    usage: 'orgauth domain verify --org ID --domain D',
    summary: 'look the domain’s TXT record up now (DNS_SERVERS, or the system’s resolvers); verified when it holds the token',
    options: { ...ORG_DOMAIN },
    run: async ({ db, config }, v) => {
      const d = await verifyDomain(db, txtLookup(config.dnsServers), await organizationOf(db, v), required(v, 'domain'));
      return { json: domainOut(d), text: `${d.domain} is verified${d.sso_required ? '; SSO is required for it' : ''}` };
    },
  },

  'domain update': {
    usage: 'orgauth domain update --org ID --domain D --sso-required yes|no',
    summary: 'require SSO of the people at a domain (no password sign-in), or stop requiring it',
    options: { ...ORG_DOMAIN, 'sso-required': { type: 'string' } },
    run: async ({ db }, v) => {
      const organizationId = await organizationOf(db, v);
      const domain = required(v, 'domain');
      const ssoRequired = yesNo(v, 'sso-required');
      if (ssoRequired === undefined) throw new UsageError('--sso-required is required');
      const d = await updateDomain(db, organizationId, domain, { sso_required: ssoRequired });
      return {
        json: domainOut(d),
        text: `${d.domain}: SSO ${d.sso_required ? 'required' : 'not required'}${d.sso_required && d.state !== 'verified' ? ' (takes effect once the domain is verified)' : ''}`,
      };
    },
  },

  'domain delete': {
    usage: 'orgauth domain delete --org ID --domain D',
    summary: 'give up a domain: its people sign in as anyone else again',
    options: { ...ORG_DOMAIN },
    run: async ({ db }, v) => {
      const organizationId = await organizationOf(db, v);
      const d = await getDomain(db, organizationId, required(v, 'domain'));
      await deleteDomain(db, organizationId, d.domain);
      return { json: { organization_id: organizationId, domain: d.domain, deleted: true }, text: `deleted domain ${d.domain}` };
    },
  },
};
