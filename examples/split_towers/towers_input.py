"""The training input of train_tf1.py: TFRecords read by queue runners, shuffled, batched.

Written for TensorFlow 1 (2017 style): `tf.train.string_input_producer`, `tf.TFRecordReader`,
`tf.train.shuffle_batch`.  Each record holds a 32x32 RGB image (raw uint8 bytes) and its label.
"""
import os

import tensorflow as tf

IMAGE_SIZE = 32
NUM_CLASSES = 10


def parse(serialized):
    """One record -> (image in [-1, 1], float32 [32, 32, 3]; label, int32)."""
    features = tf.parse_single_example(serialized, features={
        'image': tf.FixedLenFeature([], tf.string),
        'label': tf.FixedLenFeature([], tf.int64),
    })
    image = tf.decode_raw(features['image'], tf.uint8)
    image = tf.reshape(image, [IMAGE_SIZE, IMAGE_SIZE, 3])
    image = tf.cast(image, tf.float32) / 127.5 - 1.0
    label = tf.cast(features['label'], tf.int32)
    return image, label


def inputs(data_dir, batch_size, num_threads, min_after_dequeue):
    """A global batch of shuffled training rows: (images [batch, 32, 32, 3], labels [batch])."""
    files = sorted(tf.gfile.Glob(os.path.join(data_dir, 'train-*.tfrecord')))
    if not files:
        raise ValueError('no train-*.tfrecord file in %s' % data_dir)
    filename_queue = tf.train.string_input_producer(files, shuffle=True)
    reader = tf.TFRecordReader()
    _, serialized = reader.read(filename_queue)
    image, label = parse(serialized)
    images, labels = tf.train.shuffle_batch(
        [image, label], batch_size=batch_size, num_threads=num_threads,
        capacity=min_after_dequeue + 3 * batch_size, min_after_dequeue=min_after_dequeue)
    return images, labels
