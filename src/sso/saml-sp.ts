/**
 * orgauth as a SAML 2.0 service provider of an organization's IdP (SS-2), on node-saml: the
 * AuthnRequest (HTTP-Redirect binding), the Response (HTTP-POST binding) and its XML signature.
 *
 * node-saml checks the signature over the assertion (required here: wantAssertionsSigned), the
 * audience, NotBefore / NotOnOrAfter within the clock skew, and refuses a response carrying more
 * than one assertion. What it leaves to its caller, done here on the verified assertion only
 * (never on the unsigned envelope around it, the ground of signature-wrapping attacks):
 * - the assertion's Issuer is the connection's IdP;
 * - a bearer SubjectConfirmation whose Recipient is this connection's ACS URL, whose
 *   NotOnOrAfter has not passed, and whose InResponseTo names a request this instance family
 *   sent and nobody consumed yet (consumed in the database, so once across instances); none
 *   means IdP-initiated, refused unless the connection allows it;
 * - the Response's Destination, when present, is the ACS URL, and its InResponseTo agrees;
 * - the assertion ID joins the replay store until its NotOnOrAfter (the caller's transaction).
 * The lifetime is capped at MAX_ASSERTION_AGE_MS after IssueInstant, so an IdP that issues
 * day-long assertions does not make the replay store hold them for days.
 */
import type { SAML } from '@node-saml/node-saml';
import { lazyImport } from '../lib/lazy.js';
import { type ConnectionRow, connectionUrls } from './connections.js';
import type { UpstreamIdentity } from './identities.js';
import { parseUntrustedXml } from './xml.js';

/** How far apart our clock and the IdP's may be. */
export const SAML_CLOCK_SKEW_MS = 60_000;
/** An assertion is accepted at most this long after it was issued, whatever its NotOnOrAfter says. */
export const MAX_ASSERTION_AGE_MS = 60 * 60 * 1000;
/** What the browser may post: a response is a few kB; an IdP with many groups a few dozen. */
export const MAX_SAML_RESPONSE_BYTES = 256 * 1024;

type XmlElement = Element;

const ASSERTION_NS = 'urn:oasis:names:tc:SAML:2.0:assertion';
const PROTOCOL_NS = 'urn:oasis:names:tc:SAML:2.0:protocol';
const BEARER = 'urn:oasis:names:tc:SAML:2.0:cm:bearer';
const XMLDSIG_NS = 'http://www.w3.org/2000/09/xmldsig#';
const SUCCESS = 'urn:oasis:names:tc:SAML:2.0:status:Success';
/** SHA-1 signatures and digests are refused (collisions are practical); these are the ones accepted. */
const STRONG_ALGORITHMS = new Set([
  'http://www.w3.org/2001/04/xmldsig-more#rsa-sha256',
  'http://www.w3.org/2001/04/xmldsig-more#rsa-sha384',
  'http://www.w3.org/2001/04/xmldsig-more#rsa-sha512',
  'http://www.w3.org/2001/04/xmlenc#sha256',
  'http://www.w3.org/2001/04/xmldsig-more#sha384',
  'http://www.w3.org/2001/04/xmlenc#sha512',
]);
const EMAIL_ATTRIBUTES = ['email', 'mail', 'emailaddress', 'urn:oid:0.9.2342.19200300.100.1.3', 'http://schemas.xmlsoap.org/ws/2005/05/identity/claims/emailaddress'];
const NAME_ATTRIBUTES = ['name', 'displayname', 'http://schemas.xmlsoap.org/ws/2005/05/identity/claims/name', 'http://schemas.microsoft.com/identity/claims/displayname'];
const EMAIL_FORMAT = 'urn:oasis:names:tc:SAML:1.1:nameid-format:emailAddress';
const TRANSIENT = 'urn:oasis:names:tc:SAML:2.0:nameid-format:transient';

/** A response refused; `reason` is for the log and the audit, never shown as is. */
export class SamlResponseError extends Error {
  override readonly name = 'SamlResponseError';
}

/** A verified assertion, before the database's checks (InResponseTo consumed, the replay store). */
export interface AcceptedAssertion {
  identity: UpstreamIdentity;
  assertionId: string;
  /** The request this answers; null for an IdP-initiated response. */
  inResponseTo: string | null;
  /** Until when the assertion ID stays in the replay store. */
  keepUntil: Date;
}

function children(parent: XmlElement, ns: string, localName: string): XmlElement[] {
  const found: XmlElement[] = [];
  for (let node = parent.firstChild; node !== null; node = node.nextSibling) {
    if (node.nodeType === 1) {
      const el = node as XmlElement;
      if (el.namespaceURI === ns && el.localName === localName) found.push(el);
    }
  }
  return found;
}

function parseXml(xml: string): XmlElement {
  const parsed = parseUntrustedXml(xml);
  if ('root' in parsed) return parsed.root;
  throw new SamlResponseError(parsed.refused === 'doctype' ? 'a DOCTYPE in the response' : `not well-formed XML: ${parsed.problem ?? 'empty'}`);
}

const time = (value: string | null): number | undefined => {
  if (value === null || value === '') return undefined;
  const ms = Date.parse(value);
  return Number.isNaN(ms) ? undefined : ms;
};

/** node-saml (and xml-crypto under it), loaded with the first SAML request rather than at every start. */
const nodeSaml = lazyImport(() => import('@node-saml/node-saml'));

export class SamlServiceProvider {
  constructor(private readonly issuer: string) {}

  private async saml(row: ConnectionRow, requestId?: string, forceAuthn = false): Promise<SAML> {
    const urls = connectionUrls(this.issuer, row.id);
    const { SAML, ValidateInResponseTo } = await nodeSaml();
    return new SAML({
      issuer: urls.entity_id,
      callbackUrl: urls.acs_url,
      entryPoint: row.saml_idp_sso_url ?? '',
      idpCert: row.saml_idp_certificates,
      idpIssuer: row.saml_idp_entity_id ?? '',
      audience: urls.entity_id,
      wantAssertionsSigned: true,
      wantAuthnResponseSigned: false,
      acceptedClockSkewMs: SAML_CLOCK_SKEW_MS,
      maxAssertionAgeMs: MAX_ASSERTION_AGE_MS,
      // InResponseTo is checked against the database below, not node-saml's per-process cache.
      validateInResponseTo: ValidateInResponseTo.never,
      identifierFormat: null,
      disableRequestedAuthnContext: true,
      forceAuthn,
      signatureAlgorithm: 'sha256',
      digestAlgorithm: 'sha256',
      ...(requestId !== undefined ? { generateUniqueId: () => requestId } : {}),
    });
  }

  /** The SP metadata an IdP admin imports: entity ID, ACS URL (HTTP-POST), signed assertions wanted. */
  async metadata(row: ConnectionRow): Promise<string> {
    return (await this.saml(row)).generateServiceProviderMetadata(null, null);
  }

  /**
   * The IdP's SSO URL with a deflated, base64 AuthnRequest whose ID is `requestId` (HTTP-Redirect
   * binding); `forceAuthn`: the IdP must authenticate the person again (SAML Core §3.4.1).
   */
  async authorizationUrl(row: ConnectionRow, requestId: string, relayState: string, forceAuthn = false): Promise<string> {
    return (await this.saml(row, requestId, forceAuthn)).getAuthorizeUrlAsync(relayState, undefined, {});
  }

  /** Verifies a posted SAMLResponse (see the top of the file); a SamlResponseError says why not. */
  async accept(row: ConnectionRow, samlResponse: string): Promise<AcceptedAssertion> {
    if (samlResponse.length > (MAX_SAML_RESPONSE_BYTES * 4) / 3 + 4 || !/^[A-Za-z0-9+/=\s]+$/.test(samlResponse)) throw new SamlResponseError('not a base64 SAMLResponse of a sane size');
    let profile;
    try {
      ({ profile } = await (await this.saml(row)).validatePostResponseAsync({ SAMLResponse: samlResponse }));
    } catch (err) {
      throw new SamlResponseError(`node-saml: ${err instanceof Error ? err.message : String(err)}`, { cause: err });
    }
    const assertionXml = profile?.getAssertionXml?.();
    if (!profile || assertionXml === undefined) throw new SamlResponseError('no assertion');
    const urls = connectionUrls(this.issuer, row.id);
    const now = Date.now();

    // The envelope: unsigned, so it may only agree with the assertion, never add to it.
    const response = parseXml(Buffer.from(samlResponse, 'base64').toString('utf8'));
    if (response.namespaceURI !== PROTOCOL_NS || response.localName !== 'Response') throw new SamlResponseError('the message is not a Response');
    // node-saml reads the status only when there is no assertion: a failure around a signed assertion must not sign anyone in.
    const statusCode = children(children(response, PROTOCOL_NS, 'Status')[0] ?? response, PROTOCOL_NS, 'StatusCode')[0]?.getAttribute('Value');
    if (statusCode !== SUCCESS) throw new SamlResponseError(`the IdP answered ${statusCode ?? 'without a status'}`);
    const signatures = response.getElementsByTagNameNS(XMLDSIG_NS, 'Signature');
    for (let i = 0; i < signatures.length; i++) {
      const signature = signatures.item(i);
      for (const tag of ['SignatureMethod', 'DigestMethod']) {
        const methods = signature?.getElementsByTagNameNS(XMLDSIG_NS, tag);
        for (let j = 0; j < (methods?.length ?? 0); j++) {
          const algorithm = methods?.item(j)?.getAttribute('Algorithm') ?? '';
          if (!STRONG_ALGORITHMS.has(algorithm)) throw new SamlResponseError(`a signature uses ${algorithm || 'no algorithm'}, not SHA-256 or stronger`);
        }
      }
    }
    const destination = response.getAttribute('Destination');
    if (destination !== null && destination !== '' && destination !== urls.acs_url) throw new SamlResponseError(`Destination ${destination} is not this ACS URL`);

    // The verified assertion.
    const assertion = parseXml(assertionXml);
    if (assertion.namespaceURI !== ASSERTION_NS || assertion.localName !== 'Assertion') throw new SamlResponseError('the signed element is not an Assertion');
    const assertionId = assertion.getAttribute('ID') ?? '';
    if (assertionId === '' || assertionId.length > 256) throw new SamlResponseError('the assertion has no usable ID');
    const issuerEl = children(assertion, ASSERTION_NS, 'Issuer')[0];
    if (issuerEl?.textContent?.trim() !== row.saml_idp_entity_id) throw new SamlResponseError(`the assertion's Issuer is not ${row.saml_idp_entity_id}`);
    const issuedAt = time(assertion.getAttribute('IssueInstant'));
    if (issuedAt === undefined) throw new SamlResponseError('the assertion has no IssueInstant');
    if (issuedAt > now + SAML_CLOCK_SKEW_MS) throw new SamlResponseError('the assertion was issued in the future');

    const subject = children(assertion, ASSERTION_NS, 'Subject')[0];
    const nameIdEl = subject && children(subject, ASSERTION_NS, 'NameID')[0];
    // textContent joins every text node: a comment inside the NameID (CVE-2017-11427 and kin)
    // cannot cut the value short, and the joined value is the one the signature covers.
    const nameId = nameIdEl?.textContent?.trim() ?? '';
    if (!subject || nameId === '' || nameId.length > 1024) throw new SamlResponseError('the assertion has no NameID');
    const nameIdFormat = nameIdEl?.getAttribute('Format') || 'urn:oasis:names:tc:SAML:1.1:nameid-format:unspecified';
    // A transient NameID is new at every sign-in: it cannot be the subject of a link.
    if (nameIdFormat === TRANSIENT) throw new SamlResponseError('a transient NameID names nobody across sign-ins: configure the IdP to send a persistent or emailAddress NameID');

    // SAML Web Browser SSO profile §4.1.4.2-3: a bearer confirmation for this ACS, still valid.
    const confirmations = children(subject, ASSERTION_NS, 'SubjectConfirmation').filter((c) => c.getAttribute('Method') === BEARER);
    const data = confirmations.flatMap((c) => children(c, ASSERTION_NS, 'SubjectConfirmationData')).find((d) => {
      const notOnOrAfter = time(d.getAttribute('NotOnOrAfter'));
      const notBefore = time(d.getAttribute('NotBefore'));
      return d.getAttribute('Recipient') === urls.acs_url && notOnOrAfter !== undefined && now - SAML_CLOCK_SKEW_MS < notOnOrAfter && (notBefore === undefined || now + SAML_CLOCK_SKEW_MS >= notBefore);
    });
    if (!data) throw new SamlResponseError('no bearer SubjectConfirmation for this ACS URL that is still valid (Recipient, NotOnOrAfter)');
    const inResponseTo = data.getAttribute('InResponseTo') || null;
    const envelopeInResponseTo = response.getAttribute('InResponseTo') || null;
    if (envelopeInResponseTo !== inResponseTo) throw new SamlResponseError('the Response and the assertion disagree on InResponseTo');

    const conditions = children(assertion, ASSERTION_NS, 'Conditions')[0];
    const expiries = [time(data.getAttribute('NotOnOrAfter')), time(conditions?.getAttribute('NotOnOrAfter') ?? null)].filter((t): t is number => t !== undefined);
    const keepUntil = new Date(Math.min(Math.max(...expiries), issuedAt + MAX_ASSERTION_AGE_MS) + SAML_CLOCK_SKEW_MS);

    const attributes = new Map<string, string>();
    for (const statement of children(assertion, ASSERTION_NS, 'AttributeStatement')) {
      for (const attribute of children(statement, ASSERTION_NS, 'Attribute')) {
        const name = (attribute.getAttribute('Name') ?? '').toLowerCase();
        const value = children(attribute, ASSERTION_NS, 'AttributeValue')[0]?.textContent?.trim();
        if (value !== undefined && value !== '' && !attributes.has(name)) attributes.set(name, value);
      }
    }
    const pick = (names: string[]) => names.map((n) => attributes.get(n)).find((v) => v !== undefined);
    const email = pick(EMAIL_ATTRIBUTES) ?? (nameIdFormat === EMAIL_FORMAT ? nameId : undefined);

    return {
      identity: {
        connectionId: row.id,
        issuer: row.saml_idp_entity_id ?? '',
        subjectFormat: nameIdFormat,
        subject: nameId,
        email: email?.slice(0, 320),
        // The organization's IdP is the directory of record for its addresses: asserting one is
        // its word that the address is the user's. Whether that word counts is decided by the
        // domain check (only the organization's verified domains link or provision).
        emailVerified: email !== undefined,
        name: pick(NAME_ATTRIBUTES)?.slice(0, 200),
        amr: [],
      },
      assertionId,
      inResponseTo,
      keepUntil,
    };
  }
}
