"""The runtime step's broker and image: those of the image step (one real KRaft broker on loopback,
the image dev/image.sh builds from this checkout)."""

from tests.image.conftest import kafka_broker  # noqa: F401
from tests.image.test_image import image  # noqa: F401
