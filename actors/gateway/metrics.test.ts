import { describe, expect, it } from 'vitest';
import { GatewayMetrics, labelKey } from './metrics.js';

describe('metrics', () => {
  it('writes label sets with sorted names and Prometheus escapes', () => {
    expect(labelKey({})).toBe('');
    expect(labelKey({ route: '/v1/models' })).toBe('route="/v1/models"');
    expect(labelKey({ status: '200', route: '/a' })).toBe('route="/a",status="200"');
    expect(labelKey({ s: 'a\\b"c\nd' })).toBe('s="a\\\\b\\"c\\nd"');
  });

  it('counts and buckets by label set, whatever the order the labels were given in', () => {
    const m = new GatewayMetrics();
    m.records.inc({ scenario: 'x', status: 'ok' });
    m.records.inc({ status: 'ok', scenario: 'x' }, 2);
    expect(m.records.get({ scenario: 'x', status: 'ok' })).toBe(3);
    m.commitLatency.observe(0.003);
    m.commitLatency.observe(20);
    const text = m.render();
    expect(text).toContain('reef_records_total{scenario="x",status="ok"} 3');
    expect(text).toContain('reef_record_commit_seconds_bucket{le="0.002"} 0');
    expect(text).toContain('reef_record_commit_seconds_bucket{le="0.005"} 1');
    expect(text).toContain('reef_record_commit_seconds_bucket{le="+Inf"} 2');
    expect(text).toContain('reef_record_commit_seconds_count 2');
  });

  it('leaves out the series of scenarios a scrape may not see', () => {
    const m = new GatewayMetrics();
    m.records.inc({ scenario: 'alpha', status: 'ok' });
    m.records.inc({ scenario: 'secret-beta', status: 'ok' });
    m.tokens.inc({ kind: 'prompt' }, 5);
    m.latency.observe(0.01, { route: '/x', scenario: 'secret-beta' });
    const limited = m.render((s) => s === 'alpha');
    expect(limited).toContain('reef_records_total{scenario="alpha",status="ok"} 1');
    expect(limited).toContain('reef_tokens_total{kind="prompt"} 5');
    expect(limited).not.toContain('secret-beta');
    expect(m.render()).toContain('reef_records_total{scenario="secret-beta",status="ok"} 1');
    expect(m.render()).toContain('reef_http_request_duration_seconds_bucket{route="/x",scenario="secret-beta",le="0.01"} 1');
  });
});
