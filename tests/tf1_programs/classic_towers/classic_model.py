"""A small convolutional network in the classic TF1 style: tf.contrib.slim, arg_scope, contrib regularizers.

Images are 8x8 grey-scale records of a fixed-length binary file (1 label byte, 64 image bytes).
"""
import tensorflow as tf

slim = tf.contrib.slim

FLAGS = tf.app.flags.FLAGS

IMAGE_SIZE = 8
NUM_CLASSES = 4
LABEL_BYTES = 1
IMAGE_BYTES = IMAGE_SIZE * IMAGE_SIZE
WEIGHT_DECAY = 0.0005
TOWER_NAME = 'tower'


def read_record(filename_queue):
  """One (image, label) pair from a queue of file names."""
  reader = tf.FixedLengthRecordReader(record_bytes=LABEL_BYTES + IMAGE_BYTES)
  _, value = reader.read(filename_queue)
  record = tf.decode_raw(value, tf.uint8)
  label = tf.cast(tf.strided_slice(record, [0], [LABEL_BYTES]), tf.int32)
  image = tf.reshape(tf.strided_slice(record, [LABEL_BYTES], [LABEL_BYTES + IMAGE_BYTES]),
                     [IMAGE_SIZE, IMAGE_SIZE, 1])
  image = tf.cast(image, tf.float32) / 255.0
  label.set_shape([1])
  return image, tf.reshape(label, [])


def inputs(data_dir, batch_size):
  """Shuffled batches from every train_*.bin file in data_dir."""
  filenames = tf.gfile.Glob(data_dir + '/train_*.bin')
  if not filenames:
    raise ValueError('Failed to find train_*.bin in ' + data_dir)
  filename_queue = tf.train.string_input_producer(filenames)
  image, label = read_record(filename_queue)
  return tf.train.shuffle_batch([image, label], batch_size=batch_size, num_threads=2,
                                capacity=256 + 3 * batch_size, min_after_dequeue=256)


def inference(images):
  """Logits of the network: conv 3x3x16, pool, conv 3x3x32, fully connected 64, logits."""
  with slim.arg_scope([slim.conv2d, slim.fully_connected],
                      activation_fn=tf.nn.relu,
                      weights_initializer=tf.contrib.layers.xavier_initializer(),
                      weights_regularizer=tf.contrib.layers.l2_regularizer(WEIGHT_DECAY)):
    net = slim.conv2d(images, 16, [3, 3], scope='conv1')
    net = slim.max_pool2d(net, [2, 2], scope='pool1')
    net = slim.conv2d(net, 32, [3, 3], scope='conv2')
    net = tf.reshape(net, [net.get_shape()[0].value, -1])
    dim = net.get_shape()[1].value
    net = slim.fully_connected(net, 64, scope='fc3')
    tf.logging.info('fc3 reads %d features', dim)
    logits = slim.fully_connected(net, NUM_CLASSES, activation_fn=None, scope='logits')
  return logits


def tower_loss(scope, images, labels):
  """The cross-entropy of one tower plus the weight decay, as in the classic tutorials."""
  logits = inference(images)
  cross_entropy = tf.losses.sparse_softmax_cross_entropy(labels=labels, logits=logits, scope=scope)
  regularization = tf.add_n(tf.get_collection(tf.GraphKeys.REGULARIZATION_LOSSES))
  return tf.add(cross_entropy, regularization, name='total_loss')
