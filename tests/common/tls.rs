//! Certificates made by the tests: a CA of their own and leaf certificates it signs for
//! `localhost` and `127.0.0.1`, written as PEM files.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, date_time_ymd,
};

/// A certificate authority that exists only for one test.
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl TestCa {
    pub fn new() -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "Animal Store test CA");
        TestCa {
            issuer: CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap(),
        }
    }

    /// The CA's certificate, for a client to trust.
    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A leaf for localhost, written to `dir/NAME.crt` (leaf then CA: a chain) and
    /// `dir/NAME.key`; `expired` makes one that ended in 2021.
    pub fn leaf(&self, dir: &Path, name: &str, expired: bool) -> (PathBuf, PathBuf) {
        let mut params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
        // A name of its own: OpenSSL (as in redis-cli) takes a leaf named as its issuer for a
        // self-signed certificate.
        params.distinguished_name.push(DnType::CommonName, name);
        if expired {
            params.not_before = date_time_ymd(2020, 1, 1);
            params.not_after = date_time_ymd(2021, 1, 1);
        }
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let (cert_path, key_path) = (
            dir.join(format!("{name}.crt")),
            dir.join(format!("{name}.key")),
        );
        std::fs::write(&cert_path, format!("{}{}", cert.pem(), self.pem())).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        // As `openssl req -keyout` leaves a key: its owner's alone (the gateway warns otherwise).
        std::fs::set_permissions(&key_path, std::fs::Permissions::from_mode(0o600)).unwrap();
        (cert_path, key_path)
    }

    /// A TLS acceptor presenting a fresh leaf of this CA (for a test upstream), on the process's
    /// crypto provider, as the gateway installs it.
    pub fn acceptor(&self, dir: &Path) -> tokio_rustls::TlsAcceptor {
        animal_store_gateway::tls::install_crypto_provider();
        let provider = tokio_rustls::rustls::crypto::CryptoProvider::get_default().unwrap();
        self.acceptor_on(dir, provider.clone())
    }

    /// As [`TestCa::acceptor`], on `provider`: an upstream with another TLS stack's choices.
    pub fn acceptor_on(
        &self,
        dir: &Path,
        provider: std::sync::Arc<tokio_rustls::rustls::crypto::CryptoProvider>,
    ) -> tokio_rustls::TlsAcceptor {
        use rustls_pki_types::pem::PemObject;
        use rustls_pki_types::{CertificateDer, PrivateKeyDer};
        let (cert, key) = self.leaf(dir, "upstream", false);
        let certs = CertificateDer::pem_file_iter(&cert)
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_file(&key).unwrap();
        let config = tokio_rustls::rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap();
        tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config))
    }

    /// Writes the CA's certificate to `dir/ca.pem` and returns the path.
    pub fn write_pem(&self, dir: &Path) -> PathBuf {
        let path = dir.join("ca.pem");
        std::fs::write(&path, self.pem()).unwrap();
        path
    }

    /// A raw TLS connection to `addr` trusting only this CA, offering only HTTP/1.1 by ALPN (for
    /// tests that write a request byte by byte).
    pub async fn connect_http1(
        &self,
        addr: std::net::SocketAddr,
    ) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
        self.connect(addr, b"http/1.1").await
    }

    /// A raw TLS connection to `addr` trusting only this CA, offering only `alpn`, with the
    /// gateway's own provider's key exchange groups.
    pub async fn connect(
        &self,
        addr: std::net::SocketAddr,
        alpn: &[u8],
    ) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
        use tokio_rustls::rustls::crypto::aws_lc_rs;
        self.connect_offering(addr, alpn, aws_lc_rs::DEFAULT_KX_GROUPS)
            .await
            .unwrap()
    }

    /// A raw TLS connection to `addr` trusting only this CA, offering only `alpn` and the key
    /// exchange groups `groups`, in that order (a key share for the first), on aws-lc-rs.
    pub async fn connect_offering(
        &self,
        addr: std::net::SocketAddr,
        alpn: &[u8],
        groups: &[&'static dyn tokio_rustls::rustls::crypto::SupportedKxGroup],
    ) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
        use tokio_rustls::rustls::{DEFAULT_VERSIONS, crypto::CryptoProvider};
        let provider = CryptoProvider {
            kx_groups: groups.to_vec(),
            ..tokio_rustls::rustls::crypto::aws_lc_rs::default_provider()
        };
        let config = self.client_config_on(provider, alpn, DEFAULT_VERSIONS);
        connect_with(&config, addr).await
    }

    /// A TLS client's configuration trusting only this CA, offering only `alpn` and the protocol
    /// `versions`, on aws-lc-rs with its default groups. Like any rustls client's, it keeps the
    /// sessions servers give it (in memory, 256 servers' worth): connections made with it
    /// ([`connect_with`]) offer to resume the last one.
    pub fn client_config(
        &self,
        alpn: &[u8],
        versions: &[&'static tokio_rustls::rustls::SupportedProtocolVersion],
    ) -> std::sync::Arc<tokio_rustls::rustls::ClientConfig> {
        let provider = tokio_rustls::rustls::crypto::aws_lc_rs::default_provider();
        self.client_config_on(provider, alpn, versions)
    }

    fn client_config_on(
        &self,
        provider: tokio_rustls::rustls::crypto::CryptoProvider,
        alpn: &[u8],
        versions: &[&'static tokio_rustls::rustls::SupportedProtocolVersion],
    ) -> std::sync::Arc<tokio_rustls::rustls::ClientConfig> {
        use rustls_pki_types::CertificateDer;
        use rustls_pki_types::pem::PemObject;
        let mut roots = tokio_rustls::rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(self.pem().as_bytes()) {
            roots.add(cert.unwrap()).unwrap();
        }
        let mut config = tokio_rustls::rustls::ClientConfig::builder_with_provider(
            std::sync::Arc::new(provider),
        )
        .with_protocol_versions(versions)
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        config.alpn_protocols = vec![alpn.to_vec()];
        std::sync::Arc::new(config)
    }

    /// An HTTPS client trusting only this CA; `http1` keeps it from offering HTTP/2.
    pub fn client(&self, http1: bool) -> reqwest::Client {
        let builder = reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(self.pem().as_bytes()).unwrap())
            .tls_built_in_root_certs(false)
            .https_only(true)
            .timeout(std::time::Duration::from_secs(20));
        let builder = if http1 { builder.http1_only() } else { builder };
        builder.build().unwrap()
    }
}

/// A TLS connection to `addr` (by the name `localhost`) with `config`.
pub async fn connect_with(
    config: &std::sync::Arc<tokio_rustls::rustls::ClientConfig>,
    addr: std::net::SocketAddr,
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    tokio_rustls::TlsConnector::from(config.clone())
        .connect("localhost".try_into().unwrap(), tcp)
        .await
}

/// Writes `request` on `s` and reads the answer until the gateway closes the connection.
pub async fn exchange(
    s: &mut tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
    request: &[u8],
) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    s.write_all(request).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        s.read_to_end(&mut answer),
    )
    .await
    .expect("answered and closed")
    .unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

/// A GET of the pets with `api_key` that asks the gateway to close the connection after it.
pub fn list_and_close(api_key: &str) -> String {
    format!(
        "GET /v1/pets HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {api_key}\r\nConnection: close\r\n\r\n"
    )
}
