mod error;
mod framed_read;
mod framed_write;

pub use self::error::{SendError, UserError};

use self::framed_read::FramedRead;
use self::framed_write::FramedWrite;

use crate::frame::{self, Data, Frame};
use crate::proto::Error;

use bytes::Buf;
use futures_core::Stream;
use futures_sink::Sink;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::codec::length_delimited;

use std::io;

#[derive(Debug)]
pub struct Codec<T, B> {
    inner: FramedRead<FramedWrite<T, B>>,
}

impl<T, B> Codec<T, B>
where
    T: AsyncRead + AsyncWrite + Unpin,
    B: Buf,
{
    /// Returns a new `Codec` with the default max frame size
    #[inline]
    pub fn new(io: T) -> Self {
        Self::with_max_recv_frame_size(io, frame::DEFAULT_MAX_FRAME_SIZE as usize)
    }

    /// Returns a new `Codec` with the given maximum frame size
    pub fn with_max_recv_frame_size(io: T, max_frame_size: usize) -> Self {
        // Wrap with writer
        let framed_write = FramedWrite::new(io);

        // Delimit the frames
        let delimited = length_delimited::Builder::new()
            .big_endian()
            .length_field_length(3)
            .length_adjustment(9)
            .num_skip(0) // Don't skip the header
            .new_read(framed_write);

        let mut inner = FramedRead::new(delimited);

        // Use FramedRead's method since it checks the value is within range.
        inner.set_max_frame_size(max_frame_size);

        Codec { inner }
    }
}

impl<T, B> Codec<T, B> {
    /// Updates the max received frame size.
    ///
    /// The change takes effect the next time a frame is decoded. In other
    /// words, if a frame is currently in process of being decoded with a frame
    /// size greater than `val` but less than the max frame size in effect
    /// before calling this function, then the frame will be allowed.
    #[inline]
    pub fn set_max_recv_frame_size(&mut self, val: usize) {
        self.inner.set_max_frame_size(val)
    }

    /// Returns the current max received frame size setting.
    ///
    /// This is the largest size this codec will accept from the wire. Larger
    /// frames will be rejected.
    #[cfg(feature = "unstable")]
    #[inline]
    pub fn max_recv_frame_size(&self) -> usize {
        self.inner.max_frame_size()
    }

    /// Returns the max frame size that can be sent to the peer.
    pub fn max_send_frame_size(&self) -> usize {
        self.inner.get_ref().max_frame_size()
    }

    /// Set the peer's max frame size.
    pub fn set_max_send_frame_size(&mut self, val: usize) {
        self.framed_write().set_max_frame_size(val)
    }

    /// Set the peer's header table size size.
    pub fn set_send_header_table_size(&mut self, val: usize) {
        self.framed_write().set_header_table_size(val)
    }

    /// Set the decoder header table size size.
    pub fn set_recv_header_table_size(&mut self, val: usize) {
        self.inner.set_header_table_size(val)
    }

    /// Set the max header list size that can be received.
    pub fn set_max_recv_header_list_size(&mut self, val: usize) {
        self.inner.set_max_header_list_size(val);
    }

    /// Get a reference to the inner stream.
    #[cfg(feature = "unstable")]
    pub fn get_ref(&self) -> &T {
        self.inner.get_ref().get_ref()
    }

    /// Get a mutable reference to the inner stream.
    pub fn get_mut(&mut self) -> &mut T {
        self.inner.get_mut().get_mut()
    }

    /// Takes the data payload value that was fully written to the socket
    pub(crate) fn take_last_data_frame(&mut self) -> Option<Data<B>> {
        self.framed_write().take_last_data_frame()
    }

    fn framed_write(&mut self) -> &mut FramedWrite<T, B> {
        self.inner.get_mut()
    }
}

impl<T, B> Codec<T, B>
where
    T: AsyncWrite + Unpin,
    B: Buf,
{
    /// Returns `Ready` when the codec can buffer a frame
    pub fn poll_ready(&mut self, cx: &mut Context) -> Poll<io::Result<()>> {
        self.framed_write().poll_ready(cx)
    }

    /// Returns whether the codec can buffer a frame without flushing the
    /// underlying I/O object.
    pub(crate) fn has_send_capacity(&mut self) -> bool {
        self.framed_write().has_capacity()
    }

    /// Buffer a frame.
    ///
    /// `poll_ready` must be called first to ensure that a frame may be
    /// accepted.
    ///
    /// TODO: Rename this to avoid conflicts with Sink::buffer
    pub fn buffer(&mut self, item: Frame<B>) -> Result<(), UserError> {
        self.framed_write().buffer(item)
    }

    /// Flush buffered data to the wire
    pub fn flush(&mut self, cx: &mut Context) -> Poll<io::Result<()>> {
        self.framed_write().flush(cx)
    }

    /// Shutdown the send half
    pub fn shutdown(&mut self, cx: &mut Context) -> Poll<io::Result<()>> {
        self.framed_write().shutdown(cx)
    }
}

impl<T, B> Stream for Codec<T, B>
where
    T: AsyncRead + Unpin,
{
    type Item = Result<Frame, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Pin::new(&mut self.inner).poll_next(cx)
    }
}

impl<T, B> Sink<Frame<B>> for Codec<T, B>
where
    T: AsyncWrite + Unpin,
    B: Buf,
{
    type Error = SendError;

    fn start_send(mut self: Pin<&mut Self>, item: Frame<B>) -> Result<(), Self::Error> {
        Codec::buffer(&mut self, item)?;
        Ok(())
    }
    /// Returns `Ready` when the codec can buffer a frame
    fn poll_ready(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.framed_write().poll_ready(cx).map_err(Into::into)
    }

    /// Flush buffered data to the wire
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.framed_write().flush(cx).map_err(Into::into)
    }

    fn poll_close(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        ready!(self.shutdown(cx))?;
        Poll::Ready(Ok(()))
    }
}

// TODO: remove (or improve) this
impl<T> From<T> for Codec<T, bytes::Bytes>
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    fn from(src: T) -> Self {
        Self::new(src)
    }
}

/// Animal Store's patch: a codec waiting for its peer holds neither its write buffer, nor its
/// read buffer, nor the HPACK decoder's scratch buffer, and frames still pass whole after each
/// release.
#[cfg(test)]
mod idle_buffers {
    use super::*;
    use crate::frame::{Headers, Ping, Pseudo, StreamId};
    use bytes::Bytes;
    use http::{HeaderMap, HeaderValue, Method, Uri};
    use std::future::poll_fn;
    use tokio::io::DuplexStream;

    async fn send(codec: &mut Codec<DuplexStream, Bytes>, frame: Frame<Bytes>) {
        poll_fn(|cx| codec.poll_ready(cx)).await.unwrap();
        codec.buffer(frame).unwrap();
        poll_fn(|cx| codec.flush(cx)).await.unwrap();
    }

    async fn receive(codec: &mut Codec<DuplexStream, Bytes>) -> Frame {
        poll_fn(|cx| Pin::new(&mut *codec).poll_next(cx))
            .await
            .expect("a frame")
            .expect("a valid frame")
    }

    /// Polls once: `true` if nothing is there to read yet.
    async fn waits(codec: &mut Codec<DuplexStream, Bytes>) -> bool {
        poll_fn(|cx| Poll::Ready(Pin::new(&mut *codec).poll_next(cx).is_pending())).await
    }

    #[tokio::test]
    async fn a_waiting_codec_holds_no_buffers_and_loses_no_frame() {
        let (a, b) = tokio::io::duplex(64 * 1024);
        let mut client: Codec<_, Bytes> = Codec::new(a);
        let mut server: Codec<_, Bytes> = Codec::new(b);
        assert_eq!(client.inner.get_ref().buffer_capacity(), 0);

        for round in 0..3u8 {
            // A value long enough for HPACK to Huffman-code it, and new each round, so that it
            // is sent as a literal and decoded into the scratch buffer every time.
            let value = format!("round-{round}-{}", "a".repeat(40));
            let mut fields = HeaderMap::new();
            fields.insert("x-value", HeaderValue::from_str(&value).unwrap());
            let uri: Uri = "https://example.com/pets".parse().unwrap();
            let stream = StreamId::from(u32::from(round) * 2 + 1);
            let headers = Headers::new(stream, Pseudo::request(Method::GET, uri, None), fields);
            send(&mut client, Frame::Ping(Ping::new([round; 8]))).await;
            assert_eq!(
                client.inner.get_ref().buffer_capacity(),
                0,
                "written, then freed"
            );
            send(&mut client, headers.into()).await;
            assert_eq!(
                client.inner.get_ref().buffer_capacity(),
                0,
                "written, then freed"
            );

            match receive(&mut server).await {
                Frame::Ping(ping) => assert_eq!(ping.payload(), &[round; 8]),
                other => panic!("not the ping: {other:?}"),
            }
            match receive(&mut server).await {
                Frame::Headers(headers) => {
                    assert_eq!(headers.stream_id(), stream);
                    assert_eq!(headers.fields()["x-value"], value.as_str());
                }
                other => panic!("not the headers: {other:?}"),
            }
            let (read, _) = server.inner.buffer_capacities();
            assert!(read > 0, "the read buffer is in use while frames arrive");
            assert!(waits(&mut server).await, "nothing more was sent");
            assert_eq!(
                server.inner.buffer_capacities(),
                (0, 0),
                "both freed while waiting"
            );
        }
    }

    #[tokio::test]
    async fn a_frame_that_arrives_in_pieces_keeps_the_read_buffer() {
        use tokio::io::AsyncWriteExt;
        let (mut raw, b) = tokio::io::duplex(64 * 1024);
        let mut server: Codec<_, Bytes> = Codec::new(b);
        let mut ping = bytes::BytesMut::new();
        Ping::new([7; 8]).encode(&mut ping);
        raw.write_all(&ping[..5]).await.unwrap();
        assert!(waits(&mut server).await, "half a frame is not a frame");
        assert!(server.inner.buffer_capacities().0 > 0, "the half is kept");
        raw.write_all(&ping[5..]).await.unwrap();
        match receive(&mut server).await {
            Frame::Ping(ping) => assert_eq!(ping.payload(), &[7; 8]),
            other => panic!("not the ping: {other:?}"),
        }
    }
}
