/*
 * Private to lib/ctl*.c: the frame-header and u16 helpers that the framing
 * (ctl.c) and the exec client (ctl_client.c) both write.  Little-endian, as
 * docs/exec.md specifies; sbx_ctl_put_u32/get_u32 are the public ones.
 */
#ifndef SBX_LIB_CTL_I_H
#define SBX_LIB_CTL_I_H

#include <stdint.h>

#include "sbx/ctl.h"

static inline void ctl_put_u16(uint8_t *p, uint16_t v)
{
	p[0] = v & 0xff;
	p[1] = v >> 8;
}

static inline uint16_t ctl_get_u16(const uint8_t *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}

/* An 8-byte frame header: type, flags 0, reserved 0, payload length. */
static inline void ctl_put_header(uint8_t *p, uint8_t type, uint32_t len)
{
	p[0] = type;
	p[1] = 0;
	p[2] = 0;
	p[3] = 0;
	sbx_ctl_put_u32(p + 4, len);
}

#endif
