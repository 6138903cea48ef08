package proxy

import "sync"

// copyBufferSize is the ReverseProxy copy buffer. With the default 32 KiB,
// a gzip download arrives as a run of 32 KiB chunks that Node's fetch (the
// e2b SDK) decodes pathologically slowly: 100 MB took ~50 s instead of
// ~1.2 s measured with 64 KiB on the same machine.
const copyBufferSize = 64 << 10

type bufferPool struct{ pool sync.Pool }

func newBufferPool() *bufferPool {
	return &bufferPool{pool: sync.Pool{New: func() any { b := make([]byte, copyBufferSize); return &b }}}
}

// Get implements httputil.BufferPool.
func (p *bufferPool) Get() []byte { return *p.pool.Get().(*[]byte) }

// Put implements httputil.BufferPool.
func (p *bufferPool) Put(b []byte) {
	if cap(b) >= copyBufferSize {
		b = b[:copyBufferSize]
		p.pool.Put(&b)
	}
}
