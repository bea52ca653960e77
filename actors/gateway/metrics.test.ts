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
});
