import { describe, expect, it } from 'vitest';
import * as addon from '../index.js';

describe('addon', () => {
  it('loads from node', () => {
    expect(addon.ping()).toBe('pong');
  });
});
