/**
 * The example's own data: contacts kept in memory per organization, and the MCP tools over them.
 *
 * These are not orgauth's contacts. The tokens this server receives are for this server (their
 * `aud` is its URI), and orgauth's API refuses them (RFC 8707), so the server cannot pass them on
 * to read orgauth's data. A real MCP server has data of its own too — a CRM, a ticket system —
 * partitioned by the organization orgauth names in each token, as this store is.
 */
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { z } from 'zod';

export const READ_SCOPE = 'contacts.read';
export const WRITE_SCOPE = 'contacts.write';
/** What this server's tokens may carry: the scopes its resource is registered with at orgauth. */
export const SCOPES_SUPPORTED = [READ_SCOPE, WRITE_SCOPE];

/** The scope each tool needs. Checked on the HTTP request before the tool runs (server.ts), so a client can be told to step up. */
export const TOOL_SCOPES: Readonly<Record<string, string>> = {
  list_contacts: READ_SCOPE,
  search_contacts: READ_SCOPE,
  create_contact: WRITE_SCOPE,
};

const MAX_ORGANIZATIONS = 1000;
const MAX_CONTACTS_PER_ORGANIZATION = 1000;
const MAX_SEARCH_RESULTS = 50;

export interface Contact {
  id: number;
  name: string;
  email: string | null;
}

export interface ContactInput {
  name: string;
  email?: string | null | undefined;
}

export class ContactStoreFullError extends Error {}

/** Contacts by organization id, bounded in organizations and in contacts per organization. */
export class ContactStore {
  private readonly byOrganization = new Map<number, Contact[]>();
  private nextId = 1;

  list(organizationId: number): readonly Contact[] {
    return this.byOrganization.get(organizationId) ?? [];
  }

  /** Contacts whose name or email contains `query`, ignoring case. */
  search(organizationId: number, query: string): Contact[] {
    const needle = query.toLowerCase();
    return this.list(organizationId)
      .filter((c) => c.name.toLowerCase().includes(needle) || (c.email ?? '').toLowerCase().includes(needle))
      .slice(0, MAX_SEARCH_RESULTS);
  }

  add(organizationId: number, input: ContactInput): Contact {
    let contacts = this.byOrganization.get(organizationId);
    if (contacts === undefined) {
      if (this.byOrganization.size >= MAX_ORGANIZATIONS) throw new ContactStoreFullError(`this example keeps contacts for at most ${MAX_ORGANIZATIONS} organizations`);
      contacts = [];
      this.byOrganization.set(organizationId, contacts);
    }
    if (contacts.length >= MAX_CONTACTS_PER_ORGANIZATION) throw new ContactStoreFullError(`this example keeps at most ${MAX_CONTACTS_PER_ORGANIZATION} contacts per organization`);
    const contact = { id: this.nextId++, name: input.name, email: input.email ?? null };
    contacts.push(contact);
    return contact;
  }
}

const contactShape = z.object({ id: z.number().int(), name: z.string(), email: z.string().nullable() });
const contactListShape = { organization_id: z.number().int(), contacts: z.array(contactShape) };

/** A tool result with both forms: structured (MCP 2025-06-18 `structuredContent`) and as text for older clients. */
function result<T extends Record<string, unknown>>(structured: T) {
  return { structuredContent: structured, content: [{ type: 'text' as const, text: JSON.stringify(structured) }] };
}

/**
 * An MCP server answering for one organization: the one of the token the request came with.
 * Built per request (the transport is stateless), so no tool can reach another organization's
 * contacts: it never learns another organization id.
 */
export function createContactsServer(store: ContactStore, organizationId: number): McpServer {
  const server = new McpServer({ name: 'orgauth-contacts-example', version: '1.0.0' });

  server.registerTool(
    'list_contacts',
    {
      title: 'List contacts',
      description: `Lists the contacts of the organization the user chose when authorizing (needs ${READ_SCOPE}).`,
      outputSchema: contactListShape,
      annotations: { readOnlyHint: true },
    },
    async () => result({ organization_id: organizationId, contacts: [...store.list(organizationId)] }),
  );

  server.registerTool(
    'search_contacts',
    {
      title: 'Search contacts',
      description: `Finds the organization's contacts whose name or email contains the query (needs ${READ_SCOPE}).`,
      inputSchema: { query: z.string().trim().min(1).max(200) },
      outputSchema: contactListShape,
      annotations: { readOnlyHint: true },
    },
    async ({ query }) => result({ organization_id: organizationId, contacts: store.search(organizationId, query) }),
  );

  server.registerTool(
    'create_contact',
    {
      title: 'Create a contact',
      description: `Adds a contact to the organization (needs ${WRITE_SCOPE}).`,
      inputSchema: { name: z.string().trim().min(1).max(200), email: z.email().max(254).optional() },
      outputSchema: { organization_id: z.number().int(), contact: contactShape },
    },
    async ({ name, email }) => {
      try {
        return result({ organization_id: organizationId, contact: store.add(organizationId, { name, email }) });
      } catch (err) {
        if (err instanceof ContactStoreFullError) return { isError: true, content: [{ type: 'text' as const, text: err.message }] };
        throw err;
      }
    },
  );

  return server;
}
