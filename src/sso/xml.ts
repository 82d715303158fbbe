/**
 * The one way SSO reads XML someone else wrote (IdP metadata, SAML responses): no DTD at all
 * (entity expansion, "billion laughs", and external entities are refused before parsing), and any
 * parser error is a refusal, never a best-effort tree.
 */
import { DOMParser } from '@xmldom/xmldom';

export type XmlParse = { root: Element } | { refused: 'doctype' | 'malformed'; problem?: string };

export function parseUntrustedXml(xml: string): XmlParse {
  if (/<!DOCTYPE/i.test(xml)) return { refused: 'doctype' };
  let problem: string | undefined;
  const doc = new DOMParser({
    errorHandler: { warning: () => undefined, error: (m: string) => (problem ??= m), fatalError: (m: string) => (problem ??= m) },
  }).parseFromString(xml, 'application/xml');
  if (problem !== undefined || !doc.documentElement) return { refused: 'malformed', problem: problem ?? 'empty' };
  return { root: doc.documentElement };
}
