/**
 * Redaction before the judge (`reef.redaction`): what a PRM actor sends to an external PRM
 * (`prm_api: openai`, or every PRM with `apply_to: all`) has personal data masked. The record, the
 * judgment and the judged turn keep the original: only the prompt on the wire is changed, so the
 * judge and the trainer see what the user wrote (under the owner's API keys), and the third party
 * that runs the PRM does not.
 *
 * Masks name what they stand for (`[EMAIL]`, `[PHONE]`, `[CARD]`, `[API_KEY]`, or the configured
 * pattern's name), so the PRM still reads that something was there: "mail me at [EMAIL]" is judged
 * as the user meant it. The patterns are heuristics; docs/internals.md says what they miss.
 */

export type BuiltinName = 'email' | 'phone' | 'card' | 'api_key';
export const BUILTIN_NAMES: readonly BuiltinName[] = ['email', 'phone', 'card', 'api_key'];

export interface RedactionPattern {
  name: string;
  /** A JavaScript regular expression source, matched globally (flags `gu`). */
  regex: string;
}

export interface RedactionSettings {
  builtin: readonly BuiltinName[];
  patterns: readonly RedactionPattern[];
  /** `openai`: prompts to an external OpenAI-API PRM only; `all`: every PRM's. */
  applyTo: 'openai' | 'all';
}

/** Luhn's check: a card number's last digit; 16 random digits pass it one time in ten. */
export function luhn(digits: string): boolean {
  let sum = 0;
  for (let i = 0; i < digits.length; i++) {
    let d = digits.charCodeAt(digits.length - 1 - i) - 48;
    if (i % 2 === 1) {
      d *= 2;
      if (d > 9) d -= 9;
    }
    sum += d;
  }
  return sum % 10 === 0;
}

interface Rule {
  mask: string;
  re: RegExp;
  /** Keeps a match only when it holds (a card number's Luhn digit); else the text is left. */
  accept?: (match: string) => boolean;
}

/**
 * The built-in rules, in the order they run: keys first (a key may hold digit runs a card or phone
 * rule would take in part), then e-mail addresses, cards, phones.
 */
const BUILTIN: Record<BuiltinName, Rule> = {
  // Prefixed secrets of the common providers (sk-…, sk-ant-…, ghp_…, github_pat_…, xox?-…, AKIA…,
  // AIza…), and any bearer token after "Bearer ".
  api_key: {
    mask: '[API_KEY]',
    re: /\b(?:sk-(?:ant-|proj-)?[A-Za-z0-9_-]{16,}|gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,}|xox[abpors]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16}|AIza[0-9A-Za-z_-]{35})\b|(?<=\bBearer\s+)[A-Za-z0-9._~+/=-]{16,}/g,
  },
  email: { mask: '[EMAIL]', re: /\b[A-Za-z0-9._%+-]+@(?:[A-Za-z0-9-]+\.)+[A-Za-z]{2,}\b/g },
  // 13 to 19 digits, in groups of digits with single spaces or hyphens between, that pass Luhn's
  // check: an order number or a timestamp of as many digits mostly does not.
  card: { mask: '[CARD]', re: /\b\d(?:[ -]?\d){12,18}\b/g, accept: (m) => luhn(m.replace(/[ -]/g, '')) },
  // An international number (+ and 8 to 15 digits), or a national one written as phone numbers are:
  // an area code in parentheses or 3-3-4 style groups. Bare digit runs (ids, amounts, years) are not taken.
  phone: {
    mask: '[PHONE]',
    re: /(?<![\w+])\+\d{1,3}(?:[ .-]?\(?\d{1,4}\)?){2,5}(?!\w)|(?<!\w)\(\d{2,4}\)[ .-]?\d{3,4}[ .-]?\d{3,4}(?!\w)|(?<![\w-])\d{3}[.-]\d{3}[.-]\d{4}(?![\w-])/g,
    accept: (m) => {
      const n = m.replace(/\D/g, '').length;
      return n >= 8 && n <= 15;
    },
  },
};

export class Redactor {
  private readonly rules: Rule[];

  constructor(readonly settings: RedactionSettings) {
    this.rules = [
      ...BUILTIN_NAMES.filter((n) => settings.builtin.includes(n)).map((n) => BUILTIN[n]),
      ...settings.patterns.map((p) => ({ mask: `[${p.name.toUpperCase()}]`, re: new RegExp(p.regex, 'gu') })),
    ];
  }

  /** Whether prompts to a PRM of this API are masked. */
  appliesTo(api: 'sglang' | 'openai'): boolean {
    return this.rules.length > 0 && (this.settings.applyTo === 'all' || api === 'openai');
  }

  /** The text with every match masked; how many matches were. */
  redact(text: string): { text: string; masked: number } {
    let masked = 0;
    let out = text;
    for (const rule of this.rules) {
      out = out.replace(rule.re, (m) => {
        if (m.length === 0 || (rule.accept && !rule.accept(m))) return m;
        masked++;
        return rule.mask;
      });
    }
    return { text: out, masked };
  }
}

/**
 * Why a configured pattern cannot be used, or null: it must compile, and must not match the empty
 * string (it would mask nothing and match everywhere, a sign of a mistyped pattern).
 */
export function patternProblem(regex: string): string | null {
  let re: RegExp;
  try {
    re = new RegExp(regex, 'gu');
  } catch (err) {
    return `expected a regular expression (JavaScript syntax): ${(err as Error).message}`;
  }
  if (re.test('')) return 'matches the empty string, so it would mask nothing';
  return null;
}
