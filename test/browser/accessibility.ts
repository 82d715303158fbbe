/**
 * What the accessibility browser tests share (issue 29): the audit of a page at 1280 px and at
 * 375 px (axe-core, WCAG 2 A/AA and best practices: no violation of impact serious or critical;
 * at 375 px nothing scrolls sideways; a screenshot at each width, named a11y-*), and one world
 * of people, organizations, applications and single sign-on connections to visit the pages with.
 */
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import type { AxeResults } from 'axe-core';
import type { Locator, Page } from 'playwright-core';
import { expect } from 'vitest';
import { addMember, createOrganization } from '../../src/accounts/organizations.js';
import { createRole, findRole } from '../../src/accounts/roles.js';
import { createUser } from '../../src/accounts/users.js';
import { type ApplicationWithSecret, createApplication } from '../../src/oauth/models/applications.js';
import { createGrant } from '../../src/oauth/models/grants.js';
import { createConnection } from '../../src/sso/connections.js';
import { addDomain } from '../../src/sso/domains.js';
import { TEST_SECRET_KEY } from '../helpers/app.js';
import { DEFAULT_IDP_ENTITY_ID, DEFAULT_IDP_SSO_URL, idpKeyPair } from '../helpers/saml-idp.js';
import { type BrowserWorld, enterPassword, screenshot } from './harness.js';

export const WIDE = { width: 1280, height: 800 };
export const NARROW = { width: 375, height: 800 };
const AXE_TAGS = ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa', 'wcag22aa', 'best-practice'];
/** axe-core itself, read once: put into a document when it is first audited. */
const AXE_SOURCE = readFileSync(createRequire(import.meta.url).resolve('axe-core/axe.min.js'), 'utf8');

export const PASSWORD = 'a long accessibility password';
export const OWNER = 'olive.owner@a11y.example.com';
export const COLLEAGUE = 'colin.colleague@a11y.example.com';
export const SSO_DOMAIN = 'acme-sso.example';
/** Long enough to show whether ids and URLs wrap at 375 px. */
export const LONG_REDIRECT = 'https://partner-web-application.example.com/oauth/callback/with/a/rather/long/path/segment';

/**
 * What is wrong with the page as it is now, at 1280 px and at 375 px (the page is resized, not
 * reloaded: what a form's answer shows is audited as shown); leaves it at 1280 px. Each problem
 * names the page, the width, the rule, its impact and the elements.
 */
export async function audit(page: Page, name: string): Promise<string[]> {
  const problems: string[] = [];
  // axe-core goes into each frame of the document once (not once a run); it survives resizing.
  for (const frame of page.frames()) {
    if (!(await frame.evaluate(() => typeof (window as { axe?: unknown }).axe === 'object'))) await frame.evaluate(AXE_SOURCE);
  }
  for (const viewport of [WIDE, NARROW]) {
    await page.setViewportSize(viewport);
    // Every rule of the tags, over every element, as before; only the violations' elements get
    // selectors worked out (the passing ones were never reported).
    const violations = await page.evaluate(async (tags) => {
      const { axe } = window as unknown as { axe: { run(context: Document, options: object): Promise<AxeResults> } };
      const results = await axe.run(document, { runOnly: { type: 'tag', values: tags }, resultTypes: ['violations'] });
      return results.violations.map((v) => ({ id: v.id, impact: v.impact, help: v.help, targets: v.nodes.map((n) => n.target.join(' ')) }));
    }, AXE_TAGS);
    for (const v of violations) {
      if (v.impact !== 'serious' && v.impact !== 'critical') continue;
      const targets = v.targets.slice(0, 5).join(' | ') + (v.targets.length > 5 ? ` and ${v.targets.length - 5} more` : '');
      problems.push(`${name} @${viewport.width}px: ${v.id} (${v.impact}) ${v.help} at ${targets}`);
    }
    if (viewport === NARROW) {
      const { scrollWidth, innerWidth, wide } = await page.evaluate(() => {
        // The innermost elements that reach past the right edge: what makes the page scroll.
        const past = (el: Element) => el.getBoundingClientRect().right > window.innerWidth + 0.5;
        const wide = Array.from(document.body.querySelectorAll('*'))
          .filter((el) => past(el) && !Array.from(el.children).some(past))
          .slice(0, 5)
          .map((el) => `${el.tagName.toLowerCase()}${el.id ? `#${el.id}` : ''}${Array.from(el.classList).map((c) => `.${c}`).join('')}`);
        return { scrollWidth: document.documentElement.scrollWidth, innerWidth: window.innerWidth, wide };
      });
      if (scrollWidth > innerWidth) problems.push(`${name} @${viewport.width}px: scrolls sideways (scrollWidth ${scrollWidth} > innerWidth ${innerWidth}) at ${wide.join(' | ')}`);
    }
    await screenshot(page, `a11y-${name}-${viewport.width}`);
  }
  await page.setViewportSize(WIDE);
  return problems;
}

export const expectNoProblems = (problems: string[]) => expect(problems, `\n${problems.join('\n')}\n`).toEqual([]);

/** Clicks `button` (a submit button, a link) and waits for the page it leads to. */
export async function submit(page: Page, button: Locator): Promise<void> {
  await Promise.all([page.waitForNavigation(), button.click()]);
}

/** The links to `part` in the developer outbox (GET /dev/outbox, the newest message first). */
export async function outboxLinks(page: Page, baseUrl: string, part: string): Promise<string[]> {
  await page.goto(`${baseUrl}/dev/outbox`);
  return page.locator(`a[href*="${part}"]`).evaluateAll((as) => as.map((a) => (a as HTMLAnchorElement).href));
}

/** Signs `page` in with the password, from the sign-in page; waits for `landing`. */
export async function signIn(page: Page, baseUrl: string, email: string, landing = '/dashboard'): Promise<void> {
  await page.goto(`${baseUrl}/login`);
  await enterPassword(page, email, PASSWORD);
  await Promise.all([page.waitForURL((u) => u.pathname === landing), page.click('button[type="submit"]')]);
}

export interface AccessibilityWorld {
  ownerId: number;
  colleagueId: number;
  homeId: number;
  partnerId: number;
  strictId: number;
  publicApp: ApplicationWithSecret;
  privateApp: ApplicationWithSecret;
  samlConnectionId: number;
}

/**
 * The owner of Acme Holdings (with an admin colleague, a custom role, a public application
 * holding one of the owner's grants, a private application, a verified domain with two OpenID
 * connections and a SAML one, and a domain still pending), who is also in Partner Org with a role
 * that grants part of what the public application asks, and in Strict Org, which requires
 * two-step sign-in.
 */
export async function seedAccessibilityWorld(world: BrowserWorld, callback: string): Promise<AccessibilityWorld> {
  const d = world.db.handle.db;
  const [owner, colleague] = await Promise.all([
    createUser(d, { email: OWNER, password: PASSWORD, name: 'Olive Owner' }),
    createUser(d, { email: COLLEAGUE, password: PASSWORD, name: 'Colin Colleague' }),
  ]);
  const homeId = (await createOrganization(d, { name: 'Acme Holdings', ownerUserId: owner.id })).id;
  const partnerId = (await createOrganization(d, { name: 'Partner Org', ownerUserId: colleague.id })).id;
  const strictId = (await createOrganization(d, { name: 'Strict Org', ownerUserId: colleague.id })).id;
  await d.updateTable('organizations').set({ require_mfa: true }).where('id', '=', strictId).execute();
  await createRole(d, partnerId, { name: 'contact-reader', description: 'Reads contacts', permissions: ['contacts.read'] });
  await addMember(d, { organizationId: partnerId, userId: owner.id, role: (await findRole(d, partnerId, 'contact-reader'))! });
  await addMember(d, { organizationId: strictId, userId: owner.id, role: 'member' });
  await addMember(d, { organizationId: homeId, userId: colleague.id, role: 'admin' });
  await createRole(d, homeId, { name: 'support', description: 'Answers customers: reads contacts and tasks', permissions: ['contacts.read', 'tasks.read'] });

  const publicApp = await createApplication(d, { organizationId: homeId, type: 'public', name: 'Partner Web App', redirectUris: [callback, LONG_REDIRECT], scopes: 'contacts.read contacts.write tasks.read' });
  const privateApp = await createApplication(d, { organizationId: homeId, type: 'private', name: 'Nightly Sync', scopes: 'contacts.read tasks.read' });
  const publicAppId = (await d.selectFrom('applications').select('id').where('client_id', '=', publicApp.client_id).executeTakeFirstOrThrow()).id;
  await createGrant(d, { organizationId: homeId, applicationId: publicAppId, userId: owner.id, scopes: ['contacts.read', 'contacts.write'] });

  const settings = { issuer: world.baseUrl, secretKey: TEST_SECRET_KEY, allowHttp: true };
  await addDomain(d, homeId, { domain: SSO_DOMAIN });
  await d.updateTable('sso_domains').set({ state: 'verified', verified_at: new Date() }).where('domain', '=', SSO_DOMAIN).execute();
  await addDomain(d, homeId, { domain: 'acme-labs.example' });
  for (const [name, host] of [['Acme Login', 'login.acme.example'], ['Acme Contractors', 'contractors.acme.example']] as const) {
    await createConnection(d, settings, homeId, { protocol: 'oidc', name, issuer: `https://${host}`, client_id: 'orgauth', client_secret: 'an upstream client secret 0123456789' });
  }
  const saml = await createConnection(d, settings, homeId, {
    protocol: 'saml',
    name: 'Acme SAML',
    idp_entity_id: DEFAULT_IDP_ENTITY_ID,
    idp_sso_url: DEFAULT_IDP_SSO_URL,
    idp_certificates: [idpKeyPair().certificatePem],
    idp_initiated: true,
  });
  return { ownerId: owner.id, colleagueId: colleague.id, homeId, partnerId, strictId, publicApp, privateApp, samlConnectionId: saml.id };
}
